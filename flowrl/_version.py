"""flowrl's version, in a module of its own so that any layer can read it without importing the facade."""

#: The installed flowrl's version (PEP 440).
__version__ = "0.1.0"

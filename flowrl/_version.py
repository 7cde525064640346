"""flowrl's version, in a module of its own so that any layer can read it without importing the facade."""

__version__ = "0.1.0"

"""One module per algorithm: typed config, loss and execution plan, registered by name."""

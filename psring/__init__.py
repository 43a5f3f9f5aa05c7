"""psring: parameter server vs ring all-reduce, one trainer, one ``Synchronizer`` interface."""
__version__ = "0.1.0"

"""The package version, in a module of its own: ``nsq_spark.__version__`` re-exports it,
setup.cfg reads it without importing anything, and the modules that need it (the
IDENTIFY user agent in ``config``, ``nsq-spark --version``) import it from here instead
of from the package ``__init__``, whose lazy table imports them (a cycle)."""

__version__ = "0.1.0"

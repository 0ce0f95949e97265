"""Stand-in for an SGLang inference server (no GPU), used by kimipd's simulation tests."""

__version__ = "0.1.0"

"""Shim package installed by kimipd-sglang-standin.

It is NOT SGLang: it only provides `python3 -m sglang.launch_server`, which runs the stand-in
server (sglang_standin) with the same flags the deployed containers pass to the real SGLang.
"""

__version__ = "standin"

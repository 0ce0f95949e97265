"""The upstream releases this program is written against, in one place.

The renderers (`render/`) emit flags for these releases, the contract tests parse every
rendered argv with exactly these releases' own parsers, the option tables in `cli_tables/` were
dumped from them, and the simulated cluster's image installs them. Upgrading SGLang means changing
`SGLANG` here, re-dumping the tables (`scripts/dump-cli-tables`) and re-checking the facts listed
in docs/decisions.md under "Upstream facts".
"""

SGLANG = "0.5.19"
# MiniLB (router.kind mini-lb) lives in sglang-router; 0.3.2 was its last release.
SGLANG_ROUTER = "0.3.2"
# The rust router (router.kind rust): smg, sglang-router's successor, which pairs a prefill and a
# decode only when their registrations' pairing protocols match (docs/router.md).
SMG = "1.13.0"

# Mooncake PR #2035 (dmabuf registration at the allocation base) first shipped in 0.3.12.post1;
# the image's 0.3.11.post1 fails GDR registration on this hardware.
MOONCAKE_MIN = "0.3.12.post1"

# What `sglang.srt.server_args` imports for real when its heavy imports (torch, triton, ...) are
# stubbed (sim/standin/sglang_standin/upstream.py); installed beside `sglang --no-deps`.
SGLANG_PARSER_DEPENDENCIES = (
    "pydantic", "orjson", "psutil", "requests", "numpy", "pybase64", "packaging", "pillow",
    "starlette", "msgspec", "tqdm", "pyyaml", "typing_extensions",
)

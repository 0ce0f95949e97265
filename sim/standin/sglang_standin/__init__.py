"""Stand-in for an SGLang inference server (no GPU), used by kimipd's simulation tests.

What it simulates (README.md in sim/standin has the details):
  * model loading (a sleep), readiness on /health, the fired-up banner;
  * a multi-node group: rank 0 listens on --dist-init-addr, ranks >= 1 connect and hold the
    connection; a lost peer breaks the group for good (rank 0 -> 503, ranks >= 1 exit non-zero,
    and rank 0 exits too once its watchdog fires, as SGLang's does on a hung collective);
  * ranks >= 1 serve SGLang's dummy health server once loaded;
  * PD disaggregation: prefill rank 0 runs the bootstrap server (PUT/GET /route and a KV store at
    GET /kv/<room>); decode fetches the "KV" of each request from there before it answers.

Modules: args (flags), lifecycle (one rank from start to exit), state (what the threads share,
readiness), group (the dist-init group), http_base / http_api (HTTP plumbing and routes),
bootstrap (prefill bootstrap server and KV), generation (the answers), log, upstream (the real
SGLang parser).
"""

__version__ = "0.1.0"

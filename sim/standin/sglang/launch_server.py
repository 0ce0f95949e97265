"""`python3 -m sglang.launch_server <flags>`: runs the SGLang stand-in (see sglang_standin)."""

from sglang_standin.lifecycle import main

if __name__ == "__main__":
    main()

"""The sim stack's node files are what sim/make-node-files writes, byte for byte."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from components.assets import verify_node_file_sources
from components.config import load_cluster_config
from tests.conftest import REPO, stack_values


def test_sim_node_files_match_the_pinned_sha256(tmp_path: Path) -> None:
    subprocess.run([sys.executable, str(REPO / "sim" / "make-node-files"), str(tmp_path)], check=True)
    config = load_cluster_config(stack_values("sim"))
    relocated = [f.model_copy(update={"source": str(tmp_path / Path(f.source).name)})
                 for f in config.node_files]
    digests = verify_node_file_sources(relocated, tmp_path)  # raises on any sha256 mismatch
    assert set(digests) == {f.destination for f in config.node_files}
    assert all(f.sha256 for f in config.node_files)

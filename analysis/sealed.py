"""Every published campaign is exactly as it was published: the first `dvc repro` stage.

    python -m analysis.sealed

Each published campaign's files must be the ones its ``PUBLISHED`` manifest lists, byte for byte, and the
manifest the one ``outputs/campaigns/PUBLISHED.sha256`` seals (``store.manifest``); otherwise this stops with
one line naming the file. Its deps are every published campaign's folder and the seal, so a file deleted,
added or edited in a campaign no other stage reads still stops `dvc repro` (the stages that read a campaign
check it too, through ``analysis.common``). It writes nothing, so it runs only when one of them changed.
"""
from __future__ import annotations

from analysis.common import check_published, load_params, run_script
from store.manifest import published_campaigns


def main() -> None:
    outputs_dir = load_params()["outputs_dir"]
    check_published(outputs_dir)
    names = published_campaigns(outputs_dir)
    print(f"{len(names)} published campaigns, each as published: {', '.join(names) or 'none'}")


if __name__ == "__main__":
    run_script("analysis.sealed", main)

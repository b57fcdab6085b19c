"""Published campaigns: ``outputs/campaigns/<campaign>/PUBLISHED``, the marker and the checksums in one file.

A campaign whose folder holds a ``PUBLISHED`` file is published: the pipeline never replaces a file in it
(``overwrite_published=true`` lifts that for one job), and every stage file in it is checked against its
checksum there. The file lists the sha256 of every stage file, one ``<sha256>  <stage>/<file>`` line each
(the format ``sha256sum -c PUBLISHED`` reads in that folder), so a flipped bit anywhere in a file written
before stage files carried the content hash of their rows is found. A file whose provenance record holds
that content hash is checked by it instead (a file recomputed with ``overwrite_published=true`` stays
valid although its line is then stale); a new job's file may be added to a published campaign, since it
carries its own hash. Manifests exist only for published campaigns, and only this command writes them:

    python -m store.manifest CAMPAIGN [--outputs-dir outputs]
"""
from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

from store.files import atomic_write_text
from store.layout import STAGES, StoreError, campaign_dir, stage_paths

MANIFEST = "PUBLISHED"


def manifest_path(folder: Path) -> Path:
    """The manifest of the campaign whose folder is ``folder``."""
    return Path(folder) / MANIFEST


def is_published(folder: Path) -> bool:
    """Whether the campaign whose folder is ``folder`` is published (holds a manifest)."""
    return manifest_path(folder).is_file()


def file_sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def read_manifest(folder: Path) -> dict[str, str]:
    """``<stage>/<file>`` -> sha256 of a published campaign's folder ({} when it is not published)."""
    path = manifest_path(folder)
    if not path.is_file():
        return {}
    entries = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        digest, sep, name = line.partition("  ")
        if not sep or len(digest) != 64 or not name:
            raise StoreError(f"{path} line {number} is not '<sha256>  <stage>/<file>': rewrite it with "
                             f"`python -m store.manifest {Path(folder).name}`")
        entries[name] = digest
    return entries


def check_published(path: Path) -> str | None:
    """None when stage file ``path`` (one without a content hash) matches its line in its campaign's manifest,
    or its campaign is not published; otherwise why not, in a few words."""
    folder = Path(path).parents[1]
    entries = read_manifest(folder)
    if not entries:
        return None
    expected = entries.get(f"{Path(path).parent.name}/{Path(path).name}")
    if expected is None:
        return (f"lies in published campaign {folder.name!r} but neither carries a content hash nor is listed "
                f"in its {MANIFEST} checksums")
    if file_sha256(path) != expected:
        return f"does not match its checksum in {folder / MANIFEST} (damaged or edited)"
    return None


def write_manifest(outputs_dir: str | Path, campaign: str) -> Path:
    """Mark ``campaign`` published, with the checksum of every stage file it holds now."""
    folder = campaign_dir(outputs_dir, campaign)
    files = [p for stage in STAGES for p in stage_paths(outputs_dir, campaign, stage)]
    if not files:
        raise StoreError(f"campaign {campaign!r} has no stage files under {folder}: nothing to publish")
    lines = [f"{file_sha256(p)}  {p.parent.name}/{p.name}\n" for p in files]
    return atomic_write_text(manifest_path(folder), "".join(lines))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m store.manifest",
                                     description="Mark a campaign published: (re)write its PUBLISHED checksums.")
    parser.add_argument("campaign")
    parser.add_argument("--outputs-dir", default="outputs")
    args = parser.parse_args(argv)
    try:
        path = write_manifest(args.outputs_dir, args.campaign)
    except StoreError as err:
        print(f"store.manifest: error: {err}", file=sys.stderr)
        sys.exit(1)
    print(f"wrote {path} ({len(read_manifest(path.parent))} files)")


if __name__ == "__main__":
    main()

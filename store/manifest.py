"""Published campaigns: ``outputs/campaigns/<campaign>/PUBLISHED`` lists every file of the campaign byte for byte.

A campaign is published when its folder holds a ``PUBLISHED`` manifest or the seal beside the campaigns
(``store.seal``) names it. Its manifest holds one ``<sha256>  <path>`` line per file of the folder (stage
files, provenance records included, and stored answers; paths relative to the folder), the format
``sha256sum -c PUBLISHED`` reads there; the seal holds the sha256 of the manifest. A published campaign is
as it was published when the seal matches the manifest and the folder holds exactly the files listed, each
with its sha256: a missing, changed or extra file, or a missing or changed manifest, is one line naming it
(``campaign_problem``), and the analysis stops on it. No job writes into a published campaign
(``store.extend``); only these commands write a manifest:

    python -m store.manifest CAMPAIGN [--outputs-dir outputs]     publish: list every file, seal the manifest
    python -m store.manifest --check [CAMPAIGN ...]                check published campaigns (all by default)
    python -m store.extend CAMPAIGN -- OVERRIDES                   add jobs to a published campaign on purpose
"""
from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

from store.files import atomic_write_text
from store.layout import STAGES, StoreError, campaign_dir, campaigns
from store.seal import MANIFEST, checksum_lines, read_seals, seal_campaign, seal_path

EXTEND = "python -m store.extend {campaign} -- OVERRIDES"


def manifest_path(folder: str | Path) -> Path:
    """The manifest of the campaign whose folder is ``folder``."""
    return Path(folder) / MANIFEST


def is_published(folder: str | Path) -> bool:
    """Whether the campaign whose folder is ``folder`` is published (holds a manifest, or the seal names it)."""
    folder = Path(folder)
    return manifest_path(folder).exists() or folder.name in read_seals(folder.parent)


def published_campaigns(outputs_dir: str | Path) -> list[str]:
    """The published campaigns under ``outputs_dir``: those the seal names and those holding a manifest."""
    root = Path(outputs_dir) / "campaigns"
    held = {c for c in campaigns(outputs_dir) if manifest_path(root / c).exists()}
    return sorted(held | set(read_seals(root)))


def file_sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def campaign_files(folder: str | Path) -> dict[str, Path]:
    """Every file in a campaign's folder but its manifest, by its path relative to the folder (sorted); dot files
    and files outside the stage folders count too."""
    folder = Path(folder)
    files = (p for p in folder.rglob("*") if p.is_file() and p != manifest_path(folder))
    return {p.relative_to(folder).as_posix(): p for p in sorted(files, key=lambda p: p.relative_to(folder).as_posix())}


def read_manifest(folder: str | Path) -> dict[str, str]:
    """``<path in the folder>`` -> sha256, of a published campaign's folder ({} when it holds no manifest)."""
    path = manifest_path(folder)
    if not path.is_file():
        return {}
    return {name: digest for digest, name in checksum_lines(path, "<sha256>  <file>")}


def files_problem(folder: str | Path, listed: dict[str, str], allow_extra: bool = False) -> str | None:
    """None when every file ``listed`` is in ``folder`` with its sha256 and (unless ``allow_extra``) no other
    file is; otherwise one line naming the first file that is not."""
    folder, present = Path(folder), campaign_files(folder)
    manifest = manifest_path(folder)
    for name, digest in sorted(listed.items()):
        if name not in present:
            return f"{folder / name} is missing: {manifest} lists it"
        if file_sha256(present[name]) != digest:
            return f"{folder / name} does not match its checksum in {manifest} (damaged or edited)"
    extra = [name for name in present if name not in listed]
    if extra and not allow_extra:
        return (f"{folder / extra[0]} is not listed in {manifest}: a published campaign gains no file "
                f"({EXTEND.format(campaign=folder.name)} adds jobs on purpose)")
    return None


def campaign_problem(folder: str | Path, allow_extra: bool = False) -> str | None:
    """None when the campaign in ``folder`` is not published, or is exactly as published (its manifest the
    sealed one, its files the listed ones, byte for byte); otherwise one line naming the file that is not.
    ``allow_extra``: files not listed yet are no problem (a campaign being extended)."""
    folder = Path(folder)
    manifest, seal = manifest_path(folder), seal_path(folder.parent)
    try:
        sealed = read_seals(folder.parent).get(folder.name)
        if sealed is None and not manifest.exists():
            return None
        if not manifest.is_file():
            return (f"{manifest} is missing: campaign {folder.name!r} was published ({seal} lists it); "
                    "restore it from git")
        if sealed is None:
            return (f"{manifest} has no line in {seal}: restore {seal} from git (a campaign published before seals "
                    f"is sealed by `python -m store.manifest {folder.name}`)")
        if file_sha256(manifest) != sealed:
            return f"{manifest} does not match its sha256 in {seal} (damaged or edited): restore it from git"
        listed = read_manifest(folder)
    except StoreError as err:
        return str(err)
    return files_problem(folder, listed, allow_extra)


def check_published(path: str | Path) -> str | None:
    """None when stage file ``path`` matches its line in its campaign's manifest, or its campaign holds no
    manifest; otherwise why not, in a few words."""
    folder = Path(path).parents[1]
    entries = read_manifest(folder)
    if not entries:
        return None
    expected = entries.get(f"{Path(path).parent.name}/{Path(path).name}")
    if expected is None:
        return f"lies in published campaign {folder.name!r} but is not listed in its {MANIFEST}"
    if file_sha256(path) != expected:
        return f"does not match its checksum in {folder / MANIFEST} (damaged or edited)"
    return None


def write_manifest(outputs_dir: str | Path, campaign: str) -> Path:
    """List every file ``campaign`` holds now in its manifest, and seal the manifest. The callers decide whether
    that may be done (publishing, ``store.extend``)."""
    folder = campaign_dir(outputs_dir, campaign)
    files = campaign_files(folder)
    if not any(Path(name).parts[0] in STAGES and name.endswith(".parquet") for name in files):
        raise StoreError(f"campaign {campaign!r} has no stage files under {folder}: nothing to publish")
    odd = next((name for name in files if "\n" in name or "\\" in name), None)
    if odd is not None:
        raise StoreError(f"{folder / odd!r}: a file name with a newline or backslash cannot be listed; rename it")
    text = "".join(f"{file_sha256(path)}  {name}\n" for name, path in files.items())
    path = atomic_write_text(manifest_path(folder), text)
    seal_campaign(folder.parent, campaign, hashlib.sha256(text.encode()).hexdigest())
    return path


def publish(outputs_dir: str | Path, campaign: str) -> str:
    """Publish ``campaign`` (or seal one published before seals, or find one intact); what was done, in words."""
    folder = campaign_dir(outputs_dir, campaign)
    manifest, seal = manifest_path(folder), seal_path(folder.parent)
    if campaign in read_seals(folder.parent):
        if problem := campaign_problem(folder):
            raise StoreError(problem)
        return f"campaign {campaign!r} is published and intact ({len(read_manifest(folder))} files in {manifest})"
    if manifest.exists():  # a manifest written before seals: its listed files must be intact
        listed = read_manifest(folder)
        if problem := files_problem(folder, listed, allow_extra=True):
            raise StoreError(problem)
        added = [name for name in campaign_files(folder) if name not in listed]
        write_manifest(outputs_dir, campaign)
        newly = f"; listed now besides the {len(listed)} before: {', '.join(added)}" if added else ""
        return (f"sealed campaign {campaign!r}, published before seals: {manifest} lists its "
                f"{len(listed) + len(added)} files{newly}; {seal} holds the manifest's sha256")
    write_manifest(outputs_dir, campaign)
    return (f"published campaign {campaign!r}: {manifest} lists its {len(read_manifest(folder))} files and {seal} "
            f"the manifest's sha256; no job writes into it now ({EXTEND.format(campaign=campaign)} adds jobs on "
            f"purpose); add {folder} to the deps of dvc.yaml's stage `sealed`")


def check(outputs_dir: str | Path, names: list[str] | None = None) -> list[str]:
    """The published campaigns checked (``names``, or all); StoreError naming the first file that is not as
    published."""
    names = names or published_campaigns(outputs_dir)
    for campaign in names:
        folder = campaign_dir(outputs_dir, campaign)
        if not is_published(folder):
            raise StoreError(f"campaign {campaign!r} is not published: {manifest_path(folder)} does not exist")
        if problem := campaign_problem(folder):
            raise StoreError(problem)
    return names


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m store.manifest",
                                     description="Publish a campaign (list every file in its PUBLISHED manifest and "
                                                 "seal it), or check published campaigns.")
    parser.add_argument("campaigns", nargs="*", metavar="CAMPAIGN")
    parser.add_argument("--check", action="store_true", help="check the campaigns named (all published by default)")
    parser.add_argument("--outputs-dir", default="outputs")
    args = parser.parse_args(argv)
    try:
        if args.check:
            checked = check(args.outputs_dir, args.campaigns)
            print(f"{len(checked)} published campaigns as published: {', '.join(checked) or 'none'}")
            return
        if len(args.campaigns) != 1:
            raise StoreError("name one campaign to publish (or --check)")
        print(publish(args.outputs_dir, args.campaigns[0]))
    except StoreError as err:
        print(f"store.manifest: error: {err}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()

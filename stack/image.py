"""Build flightwatch's two images (``deploy/Dockerfile``) with whichever container builder this machine has.

Usage:
    python -m stack.image [--registry ghcr.io/you] [--tag 0.1.0] [--builder docker|podman|buildah] [--push]
                          [--overlay small]
    make image [REGISTRY=ghcr.io/you] [TAG=0.1.0] [PUSH=1] [OVERLAY=small]

The images are ``flightwatch`` (agents, load generator, UI) and ``flightwatch-spark`` (the same with a Java
runtime, for the Spark driver and executors), both built from the repository root, named
``REGISTRY/flightwatch:TAG`` and ``REGISTRY/flightwatch-spark:TAG`` as ``deploy/base/kustomization.yaml``'s
``images:`` names them. The builder is the first of docker, podman and buildah found on PATH, unless
``--builder`` (env FLIGHTWATCH_BUILDER) says which. Each command is printed before it runs.

With ``--push``, each pushed image's digest is read back from the registry's answer (podman's and buildah's
``push --digestfile``; docker's ``RepoDigests``), and ``deploy/overlays/pushed/kustomization.yaml`` is written
(git-ignored): ``--overlay`` with both images named by digest, not by a tag someone may move (``make deploy
OVERLAY=pushed``).

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
BASE_NAMES = {"flightwatch": "ghcr.io/flightwatch/flightwatch", "flightwatch-spark": "ghcr.io/flightwatch/flightwatch-spark"}
"""The names the base's ``images:`` give them (``deploy/base/kustomization.yaml``): what an overlay's images rewrite."""
PUSHED = os.path.join(ROOT, "deploy", "overlays", "pushed")


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


def commands(tool: str, registry: str, tag: str, push: bool, digests: str | None = None) -> list[list[str]]:
    """The build (and push) commands of both images, for ``tool`` (docker and podman take the same; buildah its own);
    podman's and buildah's pushes write each digest to ``digests/<target>`` when given."""
    out = []
    for target in TARGETS:
        ref = f"{registry.rstrip('/')}/{target}:{tag}"
        verb = ["bud"] if os.path.basename(tool) == "buildah" else ["build"]
        out.append([tool, *verb, "-f", os.path.join(ROOT, "deploy", "Dockerfile"), "--target", target, "-t", ref, ROOT])
        if push:
            keep = (["--digestfile", os.path.join(digests, target)]
                    if digests and os.path.basename(tool) != "docker" else [])
            out.append([tool, "push", *keep, ref])
    return out


def digest_of(tool: str, registry: str, tag: str, target: str, digests: str) -> str:
    """The pushed image's digest (``sha256:...``); ValueError when the builder did not say it."""
    import re

    if os.path.basename(tool) == "docker":
        ref = f"{registry.rstrip('/')}/{target}"
        out = subprocess.run([tool, "image", "inspect", "--format", "{{range .RepoDigests}}{{println .}}{{end}}",
                              f"{ref}:{tag}"], capture_output=True, text=True).stdout
        found = [line.split("@", 1)[1] for line in out.split() if line.startswith(ref + "@")]
    else:
        try:
            with open(os.path.join(digests, target)) as f:
                found = [f.read().strip()]
        except OSError:
            found = []
    if not found or not re.fullmatch(r"sha256:[0-9a-f]{64}", found[0]):
        raise ValueError(f"no digest for {target} after its push ({found[0] if found else 'none given'})")
    return found[0]


def write_overlay(overlay: str, registry: str, digests: dict[str, str], out: str = PUSHED) -> str:
    """``out/kustomization.yaml``: ``overlay`` with the images named by digest; its path."""
    import yaml

    os.makedirs(out, exist_ok=True)
    doc = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
           "resources": [os.path.relpath(os.path.join(ROOT, "deploy", "overlays", overlay), out)],
           "images": [{"name": BASE_NAMES[t], "newName": f"{registry.rstrip('/')}/{t}", "digest": digests[t]}
                      for t in TARGETS]}
    path = os.path.join(out, "kustomization.yaml")
    with open(path, "w") as f:
        f.write(f"# written by `make image PUSH=1`: the {overlay} overlay with the images just pushed, by digest\n")
        yaml.safe_dump(doc, f, sort_keys=False)
    return path


def parser() -> OneLineParser:
    ap = OneLineParser(prog="python -m stack.image", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    settings.add(ap, "FLIGHTWATCH_REGISTRY", "--registry", default=DEFAULT_REGISTRY, help="where the images are named")
    ap.add_argument("--tag", default=DEFAULT_TAG, help="the images' tag (default %(default)s)")
    settings.add(ap, "FLIGHTWATCH_BUILDER", "--builder", choices=BUILDERS,
                 help="docker, podman or buildah (default: the first found on PATH)")
    ap.add_argument("--push", action="store_true", help="push both images after building them, and write the overlay "
                    "deploy/overlays/pushed that names them by digest")
    ap.add_argument("--overlay", default="small", help="with --push: the overlay deploy/overlays/pushed builds on "
                    "(default %(default)s)")
    ap.add_argument("--overlay-dir", default=PUSHED, help="with --push: where that overlay is written (default "
                    "deploy/overlays/pushed)")
    return ap


def main(argv=None) -> int:
    try:
        a = parser().parse_args(argv)
    except SystemExit as e:
        return 2 if e.code else 0
    try:
        tool = builder(a.builder)
        if a.push and not os.path.exists(os.path.join(ROOT, "deploy", "overlays", a.overlay, "kustomization.yaml")):
            raise ValueError(f"unknown overlay {a.overlay!r}")
    except ValueError as e:
        print(f"image: error: {e}", file=sys.stderr)
        return 2
    import tempfile

    with tempfile.TemporaryDirectory(prefix="flightwatch-image-") as digests:
        for cmd in commands(tool, a.registry, a.tag, a.push, digests):
            print("+ " + " ".join(cmd), flush=True)
            if subprocess.run(cmd).returncode != 0:
                print(f"image: error: {os.path.basename(tool)} failed: {' '.join(cmd[1:3])}", file=sys.stderr)
                return 1
        registry = a.registry.rstrip("/")
        print("images: " + ", ".join(f"{registry}/{t}:{a.tag}" for t in TARGETS))
        if not a.push:
            return 0
        try:
            found = {t: digest_of(tool, a.registry, a.tag, t, digests) for t in TARGETS}
        except ValueError as e:
            print(f"image: error: {e}", file=sys.stderr)
            return 1
    path = write_overlay(a.overlay, a.registry, found, a.overlay_dir)
    print(f"by digest: {', '.join(f'{registry}/{t}@{d}' for t, d in found.items())}\n"
          f"overlay: {path} (make deploy OVERLAY={os.path.basename(os.path.dirname(path))})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

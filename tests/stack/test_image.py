"""``make image``: both images built with whichever builder is here, named as the manifests name them. No container
engine runs on these machines, so the builders are stand-ins on PATH that record their command line (a real build
runs in the kind workflow, .github/workflows/kind.yml)."""
from __future__ import annotations

import os
import subprocess
import sys

from support import ROOT


def _fake(bin_dir, name: str, code: int = 0) -> None:
    path = bin_dir / name
    path.write_text(f"#!/bin/sh\necho \"$0 $*\" >> {bin_dir}/calls\nexit {code}\n")
    path.chmod(0o755)


def _image(bin_dir, *args):
    env = dict(os.environ, PATH=f"{bin_dir}:/usr/bin:/bin", PYTHONPATH=ROOT)
    env.pop("FLIGHTWATCH_BUILDER", None)
    return subprocess.run([sys.executable, "-m", "stack.image", *args], cwd=ROOT, env=env, capture_output=True, text=True)


def test_no_builder_is_one_line_and_exit_2(tmp_path):
    r = _image(tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("image: error: no container builder here (docker, podman, buildah)")
    r = _image(tmp_path, "--builder", "podman")
    assert r.returncode == 2 and r.stderr == "image: error: podman is not installed here\n"


def test_both_images_with_the_first_builder_found_named_as_the_manifests_name_them(tmp_path):
    import re

    import yaml

    _pusher(tmp_path, "podman")
    _fake(tmp_path, "buildah")
    r = _image(tmp_path, "--registry", "registry.local:5000/me/", "--tag", "1.2.3", "--push",
               "--overlay-dir", str(tmp_path / "pushed"))
    assert r.returncode == 0, r.stderr
    dockerfile = os.path.join(ROOT, "deploy", "Dockerfile")
    calls = [re.sub(r"--digestfile \S+/", "--digestfile D/", line) for line in (tmp_path / "calls").read_text().splitlines()]
    assert calls == [f"{tmp_path}/podman build -f {dockerfile} --target flightwatch -t registry.local:5000/me/flightwatch:1.2.3 {ROOT}",
                     f"{tmp_path}/podman push --digestfile D/flightwatch registry.local:5000/me/flightwatch:1.2.3",
                     f"{tmp_path}/podman build -f {dockerfile} --target flightwatch-spark -t "
                     f"registry.local:5000/me/flightwatch-spark:1.2.3 {ROOT}",
                     f"{tmp_path}/podman push --digestfile D/flightwatch-spark registry.local:5000/me/flightwatch-spark:1.2.3"]
    # the defaults are the names the base's images: rewrite to
    with open(os.path.join(ROOT, "deploy", "base", "kustomization.yaml")) as f:
        images = {i["name"]: f"{i['newName']}:{i['newTag']}" for i in yaml.safe_load(f)["images"]}
    (tmp_path / "calls").unlink()
    assert _image(tmp_path, "--builder", "buildah").returncode == 0
    built = [line.split(" -t ")[1].split()[0] for line in (tmp_path / "calls").read_text().splitlines()]
    assert built == [images["flightwatch"], images["flightwatch-spark"]]
    assert all(" bud -f " in line for line in (tmp_path / "calls").read_text().splitlines())


def test_a_failed_build_is_exit_1_and_stops(tmp_path):
    _fake(tmp_path, "docker", code=1)
    r = _image(tmp_path)
    assert r.returncode == 1 and r.stderr.strip() == "image: error: docker failed: build -f"
    assert len((tmp_path / "calls").read_text().splitlines()) == 1


def test_the_guide_follows_the_kind_workflow_step_by_step():
    """The Kubernetes guide's "Try it on kind" runs the workflow's commands, in the workflow's order (the run ID
    aside)."""
    import re

    import yaml

    with open(os.path.join(ROOT, ".github", "workflows", "kind.yml")) as f:
        workflow = yaml.safe_load(f)
    commands = []
    for step in workflow["jobs"]["kind"]["steps"]:
        for line in re.sub(r"\\\n\s*", "", step.get("run", "")).splitlines():
            line = line.split("  #")[0].split(" || ")[0].strip()
            if re.match(r"(make|kind|kubectl|helm|docker) ", line) and "RUN_ID" not in line and "get " not in line:
                commands.append(" ".join(line.split()))
        if step.get("uses", "").startswith("helm/kind-action"):
            commands.append(f"kind create cluster --name {step['with']['cluster_name']} --image {step['with']['node_image']}")
    text = open(os.path.join(ROOT, "docs", "how-to", "kubernetes.md")).read()
    section = text[text.index("## Try it on kind"):].split("```")[1]
    shown = [" ".join(line.split("  #")[0].split()) for line in re.sub(r"\\\n\s*", "", section).splitlines()]
    shown = [line for line in shown if re.match(r"(make|kind|kubectl|helm|docker) ", line)]
    missing = [c for c in commands if c not in shown]
    assert not missing, missing
    assert [shown.index(c) for c in commands] == sorted(shown.index(c) for c in commands)
    assert "make undeploy OVERLAY=kind STORAGE_CLASS=nfs" in shown and "make image" in " ".join(shown)


def _pusher(bin_dir, name: str) -> None:
    """A builder stand-in whose push says a digest as the real one does: podman and buildah into --digestfile,
    docker in ``image inspect``'s RepoDigests."""
    path = bin_dir / name
    path.write_text(f"""#!/bin/sh
echo "$0 $*" >> {bin_dir}/calls
case "$1 $2" in
  "push --digestfile") printf 'sha256:%064d' "$(echo "$4" | grep -c spark)" > "$3" ;;
  "image inspect") ref="${{5%:*}}"; printf '%s@sha256:%064d\\n' "$ref" "$(echo "$5" | grep -c spark)" ;;
esac
exit 0
""")
    path.chmod(0o755)


def test_a_push_writes_an_overlay_that_names_both_images_by_digest(tmp_path):
    """podman and docker alike: the pushed images' digests go into an overlay on the one asked for, and kustomize
    renders every flightwatch container, the SparkApplication's image included, as name@sha256:..."""
    import yaml

    from stack import deploy

    for tool in ("podman", "docker"):
        bins = tmp_path / tool
        bins.mkdir()
        _pusher(bins, tool)
        out = tmp_path / f"pushed-{tool}"
        r = _image(bins, "--registry", "registry.local:5000/me", "--tag", "1.2.3", "--push", "--overlay", "kind",
                   "--overlay-dir", str(out))
        assert r.returncode == 0, r.stderr
        zero, one = "sha256:" + "0" * 64, "sha256:" + "0" * 63 + "1"
        assert f"registry.local:5000/me/flightwatch@{zero}, registry.local:5000/me/flightwatch-spark@{one}" in r.stdout
        rendered = subprocess.run([deploy.kubectl(), "kustomize", str(out)], capture_output=True, text=True, check=True)
        images = set()
        for doc in yaml.safe_load_all(rendered.stdout):
            spec = (doc or {}).get("spec") or {}
            pod = (spec.get("template") or spec.get("jobTemplate", {}).get("spec", {}).get("template") or {}).get("spec", {})
            images |= {c["image"] for c in pod.get("containers", []) + pod.get("initContainers", [])}
            if doc and doc.get("kind") == "SparkApplication":
                images.add(spec["image"])
        ours = {i for i in images if "flightwatch" in i}
        assert ours == {f"registry.local:5000/me/flightwatch@{zero}", f"registry.local:5000/me/flightwatch-spark@{one}"}
        assert "flightwatch.io/size: kind" in rendered.stdout  # on the overlay asked for


def test_a_push_whose_digest_cannot_be_read_is_exit_1(tmp_path):
    _fake(tmp_path, "podman")  # pushes, but writes no digest file
    r = _image(tmp_path, "--push", "--overlay-dir", str(tmp_path / "out"))
    assert r.returncode == 1 and r.stderr.strip() == "image: error: no digest for flightwatch after its push (none given)"
    assert not (tmp_path / "out").exists()
    bad = _image(tmp_path, "--push", "--overlay", "nope")
    assert bad.returncode == 2 and bad.stderr.strip() == "image: error: unknown overlay 'nope'"

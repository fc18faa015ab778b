"""`nox -s gha` (.ci/gha/gha.py): the actions' tarballs checked against SHA256SUMS, the act
command line for each job, the job selection and the summary (no engine, no act run here)."""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import re
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

from torchbuild.comms import step as comms

ROOT = Path(__file__).resolve().parents[3]


def _load():
    spec = importlib.util.spec_from_file_location("gha", ROOT / ".ci" / "gha" / "gha.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["gha"] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


gha = _load()


def _action_tarball(path: Path, files: dict[str, bytes]) -> str:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def actions_dir(tmp_path: Path) -> Path:
    """Two action release trees as tarballs, with their SHA256SUMS (as in ../shared/actions)."""
    d = tmp_path / "actions"
    d.mkdir()
    lines = []
    for name in gha.ACTIONS.values():
        digest = _action_tarball(d / name, {"action.yml": b"runs:\n  using: node24\n", "dist/index.js": b"//\n"})
        lines.append(f"{digest}  {name}")
    (d / "SHA256SUMS").write_text("\n".join(lines) + "\n")
    return d


def test_verified_archives_accepts_matching_tarballs_and_unpacks_each_action(actions_dir, tmp_path):
    archives = gha.verified_archives(actions_dir)
    assert set(archives) == {"actions/checkout@v5", "actions/setup-python@v6"}
    dirs = gha.unpack_actions(archives, tmp_path / "scratch")
    for ref, d in dirs.items():
        assert (d / "action.yml").is_file() and (d / "dist" / "index.js").is_file(), ref
    assert len({d for d in dirs.values()}) == 2


def test_a_changed_tarball_is_named_with_both_digests(actions_dir):
    target = actions_dir / "actions-setup-python-v6.tar.gz"
    target.write_bytes(target.read_bytes() + b"tampered")
    with pytest.raises(gha.GhaError) as err:
        gha.verified_archives(actions_dir)
    message = str(err.value)
    assert str(target) in message and "SHA256SUMS says" in message and "\n" not in message


def test_a_missing_tarball_or_sums_file_is_named(actions_dir):
    (actions_dir / "actions-checkout-v5.tar.gz").unlink()
    with pytest.raises(gha.GhaError, match=r"actions-checkout-v5\.tar\.gz is missing"):
        gha.verified_archives(actions_dir)
    (actions_dir / "SHA256SUMS").unlink()
    with pytest.raises(gha.GhaError, match=r"SHA256SUMS is missing"):
        gha.verified_archives(actions_dir)


def test_a_tarball_without_a_line_in_the_sums_is_refused(actions_dir):
    sums = actions_dir / "SHA256SUMS"
    sums.write_text("".join(line + "\n" for line in sums.read_text().splitlines() if "checkout" not in line))
    with pytest.raises(gha.GhaError, match=r"actions-checkout-v5\.tar\.gz has no line in"):
        gha.verified_archives(actions_dir)


def test_a_tarball_that_is_not_an_action_tree_is_refused(tmp_path):
    bad = tmp_path / "x.tar.gz"
    _action_tarball(bad, {"README.md": b"no action here"})
    with pytest.raises(gha.GhaError, match=r"no action\.yml"):
        gha.unpack_actions({"actions/checkout@v5": bad}, tmp_path / "scratch")


def test_binary_mode_sums_lines_are_read(tmp_path):
    sums = tmp_path / "SHA256SUMS"
    sums.write_text("ABC123 *a.tar.gz\ndef456  b.tar.gz\n\n")
    assert gha.read_sums(sums) == {"a.tar.gz": "abc123", "b.tar.gz": "def456"}


def test_a_sums_file_that_is_not_utf8_exits_2_with_one_line(capsys, actions_dir):
    """Issue 41 item 11: a non-UTF-8 SHA256SUMS was a UnicodeDecodeError traceback."""
    sums = actions_dir / "SHA256SUMS"
    sums.write_bytes(b"\xff\xfe" + sums.read_bytes())
    assert gha.main(["--actions", str(actions_dir), "lint"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {sums} is not UTF-8 text (byte 0xff at offset 0)") and err.count("\n") == 1, err


@pytest.mark.parametrize(
    ("member", "why"),
    [("../escaped.txt", "outside the tree"), ("/tmp/absolute.txt", "outside the tree")],
)
def test_an_action_tarball_with_a_member_outside_its_directory_is_refused(tmp_path, member, why):
    """Issue 41 item 11: tarfile's data filter raised OutsideDestinationError, a traceback."""
    bad = tmp_path / "x.tar.gz"
    _action_tarball(bad, {"action.yml": b"runs: {}\n", member: b"pwned"})
    with pytest.raises(gha.GhaError) as err:
        gha.unpack_actions({"actions/checkout@v5": bad}, tmp_path / "scratch")
    message = str(err.value)
    assert message.startswith(f"{bad}: refusing unsafe tarball member {member!r}") and why in message, message
    assert not (tmp_path / "scratch" / "escaped.txt").exists() and not Path("/tmp/absolute.txt").exists()


def test_a_damaged_action_tarball_is_named(tmp_path):
    bad = tmp_path / "x.tar.gz"
    _action_tarball(bad, {"action.yml": b"runs: {}\n" * 1000})
    bad.write_bytes(bad.read_bytes()[:60])
    with pytest.raises(gha.GhaError, match=r"is not a readable tarball"):
        gha.unpack_actions({"actions/checkout@v5": bad}, tmp_path / "scratch")


def _argv(job_name: str, **opts: object) -> list[str]:
    actions = {"actions/checkout@v5": Path("/s/co"), "actions/setup-python@v6": Path("/s/sp")}
    return gha.act_argv(gha.JOBS[job_name], actions, Path("/s/event.json"), gha.ActOptions(act="/v/act", **opts))


def _pairs(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == flag]


def test_the_lint_job_runs_offline_on_the_local_runner_image_without_the_docker_socket():
    argv = _argv("lint", cpu_shares=64)
    assert argv[:8] == ["/v/act", "push", "-W", ".github/workflows/ci.yml", "-j", "lint", "-e", "/s/event.json"]
    assert _pairs(argv, "--local-repository") == ["actions/checkout@v5=/s/co", "actions/setup-python@v6=/s/sp"]
    assert _pairs(argv, "-P") == ["ubuntu-24.04=torchbuild-gha/runner:ubuntu-24.04"]
    assert {"--action-offline-mode", "--pull=false", "--rm"} <= set(argv)
    assert _pairs(argv, "--container-daemon-socket") == ["-"] and "--bind" not in argv
    assert _pairs(argv, "--container-options") == ["--cpu-shares 64"]


def test_the_wheel_job_gets_the_host_socket_its_workdir_at_the_host_path_and_shared_mounts():
    argv = _argv("wheel", mounts=("/tmp/x-shared",))
    assert argv[1] == "workflow_dispatch" and _pairs(argv, "-W") == [".github/workflows/wheel.yml"]
    assert "--bind" in argv
    assert _pairs(argv, "--container-daemon-socket") == ["unix:///var/run/docker.sock"]
    assert _pairs(argv, "--container-options") == ["-v /tmp/x-shared:/tmp/x-shared"]


def test_matrix_rows_pick_their_row_and_arm_rows_map_the_arm_label():
    argv = _argv("image-gh200-aarch64")
    assert _pairs(argv, "-j") == ["matrix"]
    assert _pairs(argv, "--matrix") == ["profile:gh200", "arch:aarch64"]
    assert _pairs(argv, "-P") == ["ubuntu-24.04-arm=torchbuild-gha/runner:ubuntu-24.04-arm"]
    assert _pairs(_argv("integration"), "--matrix") == ["session:integration"]


def test_no_cpu_shares_no_container_options_for_the_lint_job():
    assert "--container-options" not in _argv("lint")


def test_the_default_selection_is_every_job_that_can_run_here():
    assert [j.name for j in gha.select_jobs([])] == ["lint", "wheel", "integration", "image-cuda-x86_64"]


def test_named_jobs_run_in_the_order_given_once_each():
    assert [j.name for j in gha.select_jobs(["wheel", "lint", "wheel"])] == ["wheel", "lint"]
    assert [j.name for j in gha.select_jobs(["integration"])] == ["integration"]


def test_an_unknown_job_is_one_line_naming_the_known_ones():
    with pytest.raises(gha.GhaError) as err:
        gha.select_jobs(["lint", "lnit"])
    assert "lnit" in str(err.value) and "image-cuda-x86_64" in str(err.value) and "\n" not in str(err.value)


def test_every_job_names_a_workflow_job_and_runner_that_exist():
    import yaml

    for job in gha.JOBS.values():
        workflow = yaml.safe_load((ROOT / job.workflow).read_text())
        assert job.job in workflow["jobs"], job
        events = workflow[True]  # YAML 1.1 reads the `on:` key as True
        assert job.event in events, job
        assert all(label in gha.RUNNERS for label in job.runners), job
        for cell in job.matrix:
            key, _, value = cell.partition(":")
            rows = workflow["jobs"][job.job]["strategy"]["matrix"]["include"]
            assert any(str(row.get(key)) == value for row in rows), (job, cell)


def test_workflow_dispatch_inputs_go_into_the_event_and_must_be_declared(tmp_path):
    import yaml

    job = gha.JOBS["wheel"]
    inputs = gha.dispatch_inputs(job, tmp_path, ["/usr/local/share/ca-certificates/a.crt"])
    assert gha.event_json(job, inputs) == {"inputs": inputs}
    declared = yaml.safe_load((ROOT / job.workflow).read_text())[True]["workflow_dispatch"]["inputs"]
    assert set(inputs) <= set(declared)
    assert inputs["source"] == str(tmp_path / "minitorch")
    assert "ca_certificates=/usr/local/share/ca-certificates/a.crt" in inputs["set"].split()
    assert f"cache_dir={tmp_path / 'cache'}" in inputs["set"].split()
    assert gha.event_json(gha.JOBS["lint"], {}) == {}


def test_the_summary_gives_each_job_its_time_and_result():
    text = gha.summary([gha.Outcome("lint", 312.4, 0), gha.Outcome("wheel", 901.0, 1)])
    lines = text.splitlines()
    assert lines[1].split() == ["lint", "312s", "success"]
    assert lines[2].startswith("wheel") and "901s" in lines[2] and "failure (act exit 1)" in lines[2]


def test_list_prints_every_job_and_how_it_runs(capsys):
    assert gha.main(["--list"]) == 0
    out = capsys.readouterr().out
    listed = {line.split()[0]: line for line in out.splitlines()}
    assert set(listed) == set(gha.JOBS) and listed["integration"].endswith("(run)")


def test_a_bad_job_name_exits_2_with_one_line(capsys, actions_dir):
    assert gha.main(["--actions", str(actions_dir), "nope"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: unknown job nope") and err.count("\n") == 1


def test_the_runner_images_are_labelled_with_their_recipe_hash():
    labels = gha.runner_labels(gha.RUNNERS["ubuntu-24.04"])
    recipe = (ROOT / ".ci" / "gha" / "runner.Dockerfile").read_bytes()
    assert labels["org.torchbuild.gha.recipe-sha256"] == hashlib.sha256(recipe).hexdigest()
    assert labels["org.torchbuild.gha.runner"] == "ubuntu-24.04"


def test_event_file_is_json_the_act_run_reads(tmp_path):
    job = gha.JOBS["wheel"]
    path = tmp_path / "e.json"
    path.write_text(json.dumps(gha.event_json(job, {"profile": "cpu"})))
    assert json.loads(path.read_text())["inputs"]["profile"] == "cpu"


def test_the_wheel_job_refuses_an_out_directory_with_earlier_artifacts(tmp_path):
    job = gha.JOBS["wheel"]
    gha.check_no_earlier_output(job, tmp_path)  # no out/: fine
    (tmp_path / "out").mkdir()
    gha.check_no_earlier_output(job, tmp_path)  # empty: fine
    (tmp_path / "out" / "old.whl").write_bytes(b"")
    with pytest.raises(gha.GhaError, match=r"out is not empty: the wheel job writes and checks its artifacts there"):
        gha.check_no_earlier_output(job, tmp_path)
    gha.check_no_earlier_output(gha.JOBS["lint"], tmp_path)  # the lint job leaves no artifacts


def test_the_integration_row_sees_the_hosts_tmp_cache_fuse_and_binfmt_at_the_same_paths():
    # the suite hands tmp_path, tempfile directories and ~/.cache/torchbuild (HOME is /root under
    # the row's sudo) to `docker run -v`, resolved on the host: the job must see the same paths
    argv = _argv("integration", cpu_shares=64, mounts=("/tmp/x-shared",))
    assert "--bind" in argv and _pairs(argv, "--container-daemon-socket") == ["unix:///var/run/docker.sock"]
    options = _pairs(argv, "--container-options")[0].split()
    assert options[:2] == ["--cpu-shares", "64"]
    pairs = list(zip(options[::2], options[1::2]))
    assert ("-v", "/tmp:/tmp") in pairs and ("-v", "/root/.cache/torchbuild:/root/.cache/torchbuild") in pairs
    assert ("--device", "/dev/fuse") in pairs and ("--cap-add", "SYS_ADMIN") in pairs
    assert "--privileged" not in options  # it fails here


def test_the_integration_row_reads_the_hosts_release_tarballs_read_only_at_their_path():
    # the comms tests read ../shared/sources (NCCL, aws-ofi-nccl): the first act run of the row
    # errored in all 8 of them without it
    options = " ".join(_pairs(_argv("integration", sources="/w/shared/sources"), "--container-options"))
    assert "-v /w/shared/sources:/w/shared/sources:ro" in options
    assert ":ro" not in " ".join(_pairs(_argv("integration"), "--container-options"))  # none on this host: no bind
    for name in ("lint", "wheel"):  # jobs that read none
        assert "shared/sources" not in " ".join(_pairs(_argv(name, sources="/w/shared/sources"), "--container-options"))


def test_jobs_that_only_drive_no_engine_get_no_devices_or_capabilities():
    for name in ("lint", "wheel"):
        options = " ".join(_pairs(_argv(name), "--container-options"))
        assert "--device" not in options and "--cap-add" not in options and "/tmp:/tmp" not in options


def test_the_gh200_row_is_refused_with_the_reason_and_listed_as_not_runnable(capsys):
    with pytest.raises(gha.GhaError) as err:
        gha.select_jobs(["lint", "image-gh200-aarch64"])
    assert "image-gh200-aarch64" in str(err.value) and "nvidia/cuda" in str(err.value) and "registry" in str(err.value)
    assert gha.main(["--list"]) == 0
    listed = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert "not runnable here" in listed["image-gh200-aarch64"] and "not runnable" not in listed["integration"]
    assert "run to its edge" in listed["image-cuda-x86_64"] and "not runnable" not in listed["image-cuda-x86_64"]


def test_the_cuda_row_runs_to_the_pull_of_the_profiles_own_base():
    job = gha.JOBS["image-cuda-x86_64"]
    assert gha.select_jobs([job.name]) == [job] and not job.runnable
    step, text = job.edge
    workflow = (ROOT / ".github" / "workflows" / "ci.yml").read_text()
    assert f"- name: {step.replace('cuda', '${{ matrix.profile }}')}" in workflow
    profile = (ROOT / "configs" / "profiles" / "cuda.yaml").read_text()
    assert f"base_image: {gha.CUDA_BASE}" in profile and gha.CUDA_BASE in text


def _act_log(image_step: str, *extra: str) -> list[str]:
    """act's step lines for the lint job, then the cuda row, its image step as given."""
    lines = [
        "[ci/lint]   ✅  Success - Main actions/checkout@v5 [1.6ms]",
        "[ci/lint]   ✅  Success - Main lint and unit tests [5m21.7s]",
        "[ci/cuda on x86_64]   ✅  Success - Set up job",
        "[ci/cuda on x86_64]   ✅  Success - Main actions/checkout@v5 [1.8ms]",
        "[ci/cuda on x86_64]   ✅  Success - Main actions/setup-python@v6 [554.8ms]",
        *extra,
        f"[ci/cuda on x86_64]   {image_step} - Main toolchain image for cuda [41.2s]",
        "[ci/cuda on x86_64]   ✅  Success - Complete job",
    ]
    return lines


EDGE = ("toolchain image for cuda", "error: ImageBuildFailed: cannot pull nvidia/cuda:12.6.3")
SAID = "[ci/cuda on x86_64]   | error: ImageBuildFailed: cannot pull nvidia/cuda:12.6.3-cudnn-devel-ubuntu24.04: 500"


def test_the_edge_is_reached_when_that_step_alone_fails_saying_its_text():
    ok, found = gha.edge_verdict(_act_log("❌  Failure", SAID), EDGE, 1)
    assert ok and "after 4 steps succeeded" in found and "actions/setup-python@v6" in found


def test_the_edge_is_not_reached_by_a_failure_elsewhere_or_another_error_or_a_success():
    early = _act_log("❌  Failure", SAID)
    early[4] = early[4].replace("✅  Success", "❌  Failure")  # setup-python failed first
    assert not gha.edge_verdict(early, EDGE, 1)[0]
    other = _act_log("❌  Failure", "[ci/cuda on x86_64]   | error: ToolMissing: docker")
    ok, found = gha.edge_verdict(other, EDGE, 1)
    assert not ok and "without saying" in found
    ok, found = gha.edge_verdict(_act_log("✅  Success", SAID), EDGE, 0)
    assert not ok and "got none" in found


def test_an_edge_outcome_counts_as_passed_only_when_reached():
    reached = gha.Outcome("image-cuda-x86_64", 60.0, 1, edge="'x' failed as expected", edge_ok=True)
    missed = gha.Outcome("image-cuda-x86_64", 60.0, 1, edge="expected step 'x' alone to fail", edge_ok=False)
    assert reached.ok and not missed.ok and not gha.Outcome("lint", 1.0, 1).ok
    assert "edge reached" in gha.summary([reached]) and "failure" in gha.summary([missed])


def test_the_cpu_image_row_starts_from_a_local_ubuntu_2404_of_its_arch_and_says_why_not_here():
    job = gha.JOBS["image-cpu-aarch64"]
    assert job.base_tag == ("ubuntu:24.04", gha.RUNNERS["ubuntu-24.04-arm"].base)
    assert "ports.ubuntu.com" in job.runnable
    profile = (ROOT / "configs" / "profiles" / "cpu.yaml").read_text()
    assert "base_image: ubuntu:24.04" in profile


def test_the_disk_is_sampled_beside_the_integration_row_only():
    assert [j.name for j in gha.JOBS.values() if j.disk] == ["integration"]


def test_dryrun_asks_act_for_the_plan_only():
    assert "--dryrun" in _argv("integration", dryrun=True) and "--dryrun" not in _argv("integration")


class _Images:
    def __init__(self, log: list[str]) -> None:
        self.log = log

    def get(self, ref: str):
        log = self.log

        class _Image:
            def tag(self, repo: str, tag: str) -> None:
                log.append(f"tag {ref} {repo}:{tag}")

        return _Image()

    def remove(self, ref: str, noprune: bool) -> None:
        self.log.append(f"remove {ref} noprune={noprune}")


class _Engine:
    def __init__(self, present: set[str]) -> None:
        self.present, self.log = present, []
        self.client = type("C", (), {"images": _Images(self.log)})()

    def image_attrs(self, ref: str):
        return {"Id": ref} if ref in self.present else None


def test_the_rows_base_is_tagged_from_the_local_one_for_the_run_and_untagged_after(capsys):
    job = gha.JOBS["image-cpu-aarch64"]
    engine = _Engine(present={"torchbuild/base:noble-aarch64"})
    with gha.base_tagged(engine, job):
        assert engine.log == ["tag torchbuild/base:noble-aarch64 ubuntu:24.04"]
    assert engine.log[-1] == "remove ubuntu:24.04 noprune=True"
    assert "ubuntu:24.04: tagged from torchbuild/base:noble-aarch64" in capsys.readouterr().out
    kept = _Engine(present={"ubuntu:24.04"})  # an engine that has one keeps it untouched
    with gha.base_tagged(kept, job):
        pass
    assert kept.log == []


def test_a_hosted_runner_fetches_the_comms_tarballs_the_product_pins_and_act_uses_the_hosts():
    """ci.yml's integration row fetches ../shared/sources on GitHub (skipped under act, where
    gha.py binds the host's copy): each file it fetches has a sum, checked by sha256sum -c, and
    the plugin's sums are the ones torchbuild's comms step pins for those releases."""
    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / "ci.yml").read_text())
    (step,) = [
        s for s in workflow["jobs"]["matrix"]["steps"] if s.get("name") == "release tarballs for the comms tests"
    ]
    assert "!env.ACT" in step["if"] and "matrix.session == 'integration'" in step["if"]
    fetched = re.findall(r"^fetch (\S+) (\S+)$", step["run"], re.M)
    sums = dict(reversed(line.split()) for line in re.findall(r"^[0-9a-f]{64}  \S+$", step["run"], re.M))
    assert {name for name, _ in fetched} == set(sums) and len(fetched) == 2 + len(comms.OFI_PINS)
    assert step["run"].rstrip().endswith("sha256sum -c SHA256SUMS")
    for version, pin in comms.OFI_PINS.items():
        assert sums[f"aws-ofi-nccl-{version}.tar.gz"] == pin
        assert (f"aws-ofi-nccl-{version}.tar.gz", comms.OFI_ARCHIVE.format(version=version)) in fetched
    for name, url in fetched:
        if name.startswith("nccl-"):
            assert url == comms.NCCL_ARCHIVE.format(version=name.removeprefix("nccl-").removesuffix(".tar.gz"))


def test_the_ubuntu_keyring_is_the_pinned_package_and_its_read_is_bounded(tmp_path):
    with pytest.raises(gha.GhaError, match="not the pinned"):
        gha.check_keyring(b"!<arch>\n a different package")
    with pytest.raises(gha.GhaError, match="over 1048576 bytes"):
        gha.check_keyring(b"\0" * (gha.KEYRING_MAX + 1))


def test_act_output_is_passed_through_and_kept_only_for_an_edge_job(capsys):
    argv = ["sh", "-c", "echo '[ci/x]   ✅  Success - Main a'; echo oops >&2; exit 3"]
    assert gha.run_act(argv, keep=True) == (3, ["[ci/x]   ✅  Success - Main a", "oops"])
    assert gha.run_act(argv, keep=False) == (3, [])
    assert capsys.readouterr().out.count("oops") == 2


def _run_scripts(doc: object) -> list[str]:
    """Every `run:` script in a workflow or action file (steps at any depth)."""
    if isinstance(doc, dict):
        own = [doc["run"]] if isinstance(doc.get("run"), str) else []
        return own + [s for v in doc.values() for s in _run_scripts(v)]
    if isinstance(doc, list):
        return [s for v in doc for s in _run_scripts(v)]
    return []


def test_no_expression_is_interpolated_into_a_run_script():
    # wheel.yml's profile is a free-text workflow_dispatch input: `"${{ inputs.profile }}"` in a
    # script runs whatever it holds; inputs and matrix values reach the scripts through env
    files = [
        *sorted((ROOT / ".github" / "workflows").glob("*.yml")),
        ROOT / ".ci" / "gha" / "upload-artifact" / "action.yml",
    ]
    scripts = [(f.name, s) for f in files for s in _run_scripts(yaml.safe_load(f.read_text()))]
    assert len(scripts) > 5
    assert [(name, s) for name, s in scripts if "${{" in s] == []
    wheel = yaml.safe_load((ROOT / ".github" / "workflows" / "wheel.yml").read_text())["jobs"]["wheel"]
    assert wheel["env"]["PROFILE"] == "${{ inputs.profile }}" and wheel["env"]["ARCH"] == "${{ inputs.arch }}"
    assert sum('--profile "$PROFILE" --arch "$ARCH"' in s for s in _run_scripts(wheel)) == 3


class _BuildEngine:
    """An engine that has only the images named, and records the labels of each build."""

    def __init__(self, present: dict[str, str]) -> None:
        self.present, self.built = present, {}

    def image_attrs(self, ref: str):
        return {"Id": self.present[ref]} if ref in self.present else None

    def build(self, ctx, *, tag, labels, **_):
        self.built[tag] = dict(labels)
        return "sha256:new"


def test_ci_run_prunes_only_the_dangling_images_torchbuild_makes(monkeypatch, tmp_path):
    # under act .ci/run drives the host's engine: an unfiltered `docker image prune -f` removed
    # every dangling image there. Each filter must match an image kind torchbuild builds
    # (toolchain, apptainer-builder, debootstrapped base), and every kind one filter.
    from torchbuild.core.arch import Arch
    from torchbuild.image import baseimage
    from torchbuild.image import host as image
    from torchbuild.profile import config
    from torchbuild.sif import host as sif

    script = (ROOT / ".ci" / "run").read_text()
    prunes = [line for line in script.splitlines() if "docker image prune" in line]
    assert prunes and all('--filter "label=$label"' in line for line in prunes), prunes
    (loop,) = re.findall(r"^for label in (.+); do$", script, re.M)
    filters = loop.split()

    spec = config.resolve("cpu", arch="x86_64")
    kinds = {"toolchain": image.labels(spec, "digest", "sha256:base")}
    engine = _BuildEngine({spec.sif_builder_base: "sha256:sid"})
    monkeypatch.setattr(sif, "cache_dir", lambda _spec: tmp_path / "cache")
    kinds["apptainer-builder"] = engine.built[sif.ensure_builder(spec, engine, out=io.StringIO())]
    monkeypatch.setattr(baseimage, "_preflight", lambda arch: "debootstrap")
    monkeypatch.setattr(baseimage, "_debootstrap", lambda *a: (a[3] / "etc").mkdir(parents=True))
    monkeypatch.setattr(baseimage, "check_platform", lambda *a: None)
    tag, made = baseimage.make_base_image(
        engine, suite="trixie", arch=Arch("x86_64"), work_dir=tmp_path / "w", out=io.StringIO()
    )
    assert made
    kinds["base"] = engine.built[tag]
    for kind, labels in kinds.items():
        assert any(f in labels for f in filters), (kind, sorted(labels))
    assert all(f.startswith("org.torchbuild.") for f in filters)


def _toolcache(root: Path, entries: dict[str, str]) -> Path:
    """A tool cache: each <tool>/<version>/<arch> entry holding one file, with its .complete."""
    for entry, text in entries.items():
        (root / entry).mkdir(parents=True)
        (root / entry / "python").write_text(text)
        (root / f"{entry}.complete").write_text("")
    root.mkdir(parents=True, exist_ok=True)
    return root


def _tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text() if p.is_file() else "/" for p in sorted(root.rglob("*"))}


def _bash(script: str, *args: str) -> str:
    import subprocess

    return subprocess.run(["bash", "-c", script, "x", *args], check=True, capture_output=True, text=True).stdout


def test_seeding_a_volume_made_elsewhere_keeps_its_entries_and_undoes_only_its_own(tmp_path):
    # act-toolcache may be the user's own act cache: an entry there is never overwritten, and
    # what this run added goes afterwards, leaving the volume as it was
    image = _toolcache(tmp_path / "image", {"Python/3.12.3/x64": "runner's venv", "node/24.0.0/x64": "node"})
    volume = _toolcache(tmp_path / "volume", {"Python/3.12.3/x64": "the user's", "Python/3.11.9/x64": "3.11"})
    (volume / "CodeQL").mkdir()
    before = _tree(volume)
    added = gha.seeded_lines(_bash(gha.SEED_SCRIPT, str(image), str(volume)))
    assert added == ["dir node", "dir node/24.0.0", "entry node/24.0.0/x64"]
    assert (volume / "Python/3.12.3/x64/python").read_text() == "the user's"
    assert (volume / "node/24.0.0/x64/python").is_file() and (volume / "node/24.0.0/x64.complete").is_file()
    _bash(gha.UNSEED_SCRIPT, str(volume), *added)
    assert _tree(volume) == before


def test_an_entry_present_without_its_marker_or_only_as_a_marker_is_kept(tmp_path):
    image = _toolcache(tmp_path / "image", {"Python/3.12.3/x64": "runner's venv", "Python/3.12.3/arm64": "arm"})
    volume = tmp_path / "volume"
    (volume / "Python/3.12.3").mkdir(parents=True)
    (volume / "Python/3.12.3/x64.complete").write_text("")
    added = gha.seeded_lines(_bash(gha.SEED_SCRIPT, str(image), str(volume)))
    assert added == ["entry Python/3.12.3/arm64"] and not (volume / "Python/3.12.3/x64").exists()
    _bash(gha.UNSEED_SCRIPT, str(volume), *added)
    assert _tree(volume) == {"Python": "/", "Python/3.12.3": "/", "Python/3.12.3/x64.complete": ""}


def test_a_new_volume_gets_every_entry_and_unseeding_refuses_paths_outside_it(tmp_path):
    image = _toolcache(tmp_path / "image", {"Python/3.12.3/x64": "runner's venv"})
    volume = tmp_path / "volume"
    volume.mkdir()
    added = gha.seeded_lines(_bash(gha.SEED_SCRIPT, str(image), str(volume)))
    assert added == ["dir Python", "dir Python/3.12.3", "entry Python/3.12.3/x64"]
    assert _tree(volume) == {**_tree(image)}
    import subprocess

    with pytest.raises(subprocess.CalledProcessError):
        _bash(gha.UNSEED_SCRIPT, str(volume), "entry ../image")
    assert _tree(image) != {}
    _bash(gha.UNSEED_SCRIPT, str(volume), *added)
    assert _tree(volume) == {}


def test_the_free_disk_step_removes_nothing_under_act():
    # under act /opt/hostedtoolcache is the act-toolcache volume, possibly the user's own, and
    # the engine is the host's: the step's rm -rf and image prune must not run there
    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / "ci.yml").read_text())
    (step,) = [s for s in workflow["jobs"]["matrix"]["steps"] if s.get("name") == "free disk space"]
    assert "!env.ACT" in step["if"] and "matrix.session == 'integration'" in step["if"]
    assert "/opt/hostedtoolcache/CodeQL" in step["run"]


class _Container:
    def __init__(self, cid: str, name: str) -> None:
        self.id, self.name = cid, name


def _containers_engine(containers: list[_Container]):
    listing = type("L", (), {"list": lambda self, all=False: list(containers)})()
    return type("E", (), {"client": type("C", (), {"containers": listing})()})()


def test_only_act_containers_that_appeared_during_the_run_are_leftovers():
    present = [_Container("a1", "act-ci-lint-old"), _Container("x1", "torchbuild-1"), _Container("a2", "act-other")]
    engine = _containers_engine(present)
    before = gha.act_containers(engine)
    assert before == {"a1": "act-ci-lint-old", "a2": "act-other"}
    assert gha.leftovers(engine, before) == []  # another act run's (or --reuse) containers
    present += [_Container("a3", "act-wheel-wheel-abc"), _Container("x2", "something-else")]
    assert gha.leftovers(engine, before) == ["act-wheel-wheel-abc"]
    present[0] = _Container("a4", "act-ci-lint-old")  # a new container under an old name is this run's
    assert gha.leftovers(engine, before) == ["act-ci-lint-old", "act-wheel-wheel-abc"]


def _docker_errors():
    import docker.errors

    return docker.errors


@pytest.mark.parametrize(
    ("error", "said"),
    [
        (
            lambda: _docker_errors().ImageNotFound("No such image: torchbuild-gha/runner:x"),
            "error: Docker engine: ImageNotFound: No such image",
        ),
        (
            lambda: _docker_errors().DockerException("Error while fetching server API version\nmore"),
            "error: Docker engine: DockerException: Error while fetching",
        ),
        (
            lambda: __import__("subprocess").CalledProcessError(2, ["dpkg-deb", "-x"]),
            "error: CalledProcessError: Command '['dpkg-deb', '-x']' returned non-zero exit status 2.",
        ),
        (
            lambda: FileNotFoundError(2, "No such file or directory", "debootstrap"),
            "error: FileNotFoundError: [Errno 2] No such file or directory: 'debootstrap'",
        ),
    ],
)
def test_engine_and_command_failures_are_one_named_line_not_a_traceback(monkeypatch, capsys, error, said):
    def fail(args):
        raise error()

    monkeypatch.setattr(gha, "run", fail)
    assert gha.main(["lint"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(said) and err.count("\n") == 1 and "Traceback" not in err


def test_a_missing_dpkg_deb_or_act_is_named(monkeypatch, tmp_path):
    class _Resp(io.BytesIO):
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(gha.urllib.request, "urlopen", lambda url, timeout: _Resp(b"deb"))
    monkeypatch.setattr(gha, "check_keyring", lambda data: None)

    def missing(*a, **k):
        raise FileNotFoundError(2, "No such file or directory", "dpkg-deb")

    monkeypatch.setattr(gha.subprocess, "run", missing)
    with pytest.raises(gha.GhaError, match="dpkg-deb is not installed"):
        gha.ubuntu_keyring(tmp_path)
    with pytest.raises(gha.GhaError, match=r"/nonexistent/act not found: install act"):
        gha.run_act(["/nonexistent/act", "push"], keep=False)


class _Volume:
    name = gha.TOOLCACHE_VOLUME

    def remove(self):
        raise _docker_errors().APIError("409 Client Error: volume is in use")


class _RunEngine:
    """An engine for run(): no act-toolcache before the run, one after that cannot be removed."""

    def __init__(self) -> None:
        self.volumes_listed = 0
        volumes = type("V", (), {"list": lambda _, filters=None: self._volumes()})()
        containers = type("Cs", (), {"list": lambda _, all=False: []})()
        self.client = type("C", (), {"volumes": volumes, "containers": containers})()

    def _volumes(self):
        self.volumes_listed += 1
        return [] if self.volumes_listed == 1 else [_Volume()]


def _fake_run(monkeypatch, run_job):
    engine = _RunEngine()
    monkeypatch.setattr(gha, "verified_archives", lambda d: {})
    monkeypatch.setattr(gha.Engine, "connect", staticmethod(lambda: engine))
    monkeypatch.setattr(gha, "ensure_runner", lambda *a: None)
    monkeypatch.setattr(gha, "seed_toolcache", lambda *a: ["entry Python/3.12.3/x64"])
    monkeypatch.setattr(gha, "ensure_job_bases", lambda *a: None)
    monkeypatch.setattr(gha, "run_job", run_job)


def test_a_failed_cleanup_is_reported_without_hiding_the_summary(monkeypatch, capsys, tmp_path):
    _fake_run(monkeypatch, lambda job, *a: gha.Outcome(job.name, 1.0, 0))
    assert gha.main(["--scratch", str(tmp_path), "lint"]) == 1  # every job passed, the cleanup did not
    out, err = capsys.readouterr()
    assert out.splitlines()[-1].split() == ["lint", "1s", "success"]
    assert err == "cleanup failed: removing the volume act-toolcache: APIError: 409 Client Error: volume is in use\n"


def test_a_failed_cleanup_never_replaces_the_runs_own_error(monkeypatch, capsys, tmp_path):
    def run_job(job, *a):
        if job.name == "wheel":
            raise gha.GhaError("the wheel job's own error")
        return gha.Outcome(job.name, 2.0, 0)

    _fake_run(monkeypatch, run_job)
    monkeypatch.setattr(gha, "check_no_earlier_output", lambda job: None)
    assert gha.main(["--scratch", str(tmp_path), "lint", "wheel"]) == 2
    out, err = capsys.readouterr()
    assert out.splitlines()[-1].split() == ["lint", "2s", "success"]  # the jobs that ended first
    lines = err.splitlines()
    assert lines[0].startswith("cleanup failed: removing the volume act-toolcache: APIError")
    assert lines[1] == "error: the wheel job's own error" and len(lines) == 2


def test_relative_paths_are_the_callers_made_absolute(monkeypatch, tmp_path):
    # act runs in the checkout, not the caller's directory, and docker reads a relative
    # `-v scratch/shared:scratch/shared` as a named volume
    monkeypatch.chdir(tmp_path)
    args = gha.parse_args(["--scratch", "s", "--actions", "../a", "--act", "bin/act", "lint"])
    assert args.scratch == tmp_path / "s" and args.actions == tmp_path / ".." / "a"
    assert args.act == str(tmp_path / "bin" / "act")
    args = gha.parse_args(["--act", "act", "lint"])
    assert args.act == "act" and args.scratch is None and args.actions.is_absolute()
    monkeypatch.setenv("TORCHBUILD_GHA_ACTIONS", "rel/actions")
    assert gha.parse_args(["lint"]).actions == tmp_path / "rel" / "actions"


def test_the_wheel_jobs_local_bases_are_made_when_missing_before_any_job(monkeypatch, tmp_path, capsys):
    # gha-cpu.yaml builds on torchbuild/base:trixie-x86_64 and its SIF on torchbuild/base:sid-x86_64;
    # only the integration suite made them, and after the wheel job in the default order
    from torchbuild.core.arch import Arch

    wheel = gha.JOBS["wheel"]
    assert gha.profile_bases(wheel) == [("trixie", Arch.X86_64), ("sid", Arch.X86_64)]
    assert gha.profile_bases(gha.JOBS["lint"]) == [] and gha.profile_bases(gha.JOBS["integration"]) == []
    made = []
    monkeypatch.setattr(gha, "make_base_image", lambda engine, **kw: made.append(kw))
    gha.ensure_job_bases(_Engine(present={"torchbuild/base:sid-x86_64"}), wheel, tmp_path)
    assert made == [
        {"suite": "trixie", "arch": Arch.X86_64, "work_dir": tmp_path / "rootfs", "ignore_valid_until": True}
    ]
    out = capsys.readouterr().out
    assert "torchbuild/base:trixie-x86_64: missing, made for the wheel job" in out
    assert "torchbuild/base:sid-x86_64: present" in out


def test_run_makes_the_jobs_bases_before_the_first_job(monkeypatch, tmp_path):
    calls = []
    _fake_run(monkeypatch, lambda job, *a: calls.append(f"run {job.name}") or gha.Outcome(job.name, 1.0, 0))
    monkeypatch.setattr(gha, "ensure_job_bases", lambda engine, job, scratch: calls.append(f"bases {job.name}"))
    monkeypatch.setattr(gha, "check_no_earlier_output", lambda job: None)
    gha.main(["--scratch", str(tmp_path), "lint", "wheel"])
    assert calls == ["bases lint", "bases wheel", "run lint", "run wheel"]


class _Api:
    """docker-py's low-level API as far as the job-container cleanup uses it."""

    def __init__(self, containers: list[dict]) -> None:
        self.listed, self.removed = containers, []

    def containers(self, all=False, filters=None):
        assert all and filters == {"label": "org.torchbuild.run=1"}
        return [c for c in self.listed if c.get("Labels", {}).get("org.torchbuild.run") == "1"]

    def remove_container(self, cid, force=False):
        assert force
        self.removed.append(cid)


def _c(cid: str, name: str, created: int, label: bool = True) -> dict:
    return {
        "Id": cid,
        "Names": [f"/{name}"],
        "Created": created,
        "Labels": {"org.torchbuild.run": "1"} if label else {},
    }


def test_only_torchbuild_containers_new_since_the_job_started_are_removed_after_it(capsys):
    # act force-removes the job container on Ctrl-C: torchbuild inside never removes the build
    # and SIF containers it started on the host's engine
    api = _Api([_c("old", "torchbuild-0123456789ab", 900)])
    engine = type("E", (), {"client": type("C", (), {"api": api})()})()
    before = gha.torchbuild_containers(engine)
    api.listed += [
        _c("new", "torchbuild-aaaaaaaaaaaa", 1001),  # the job's: removed
        _c("early", "torchbuild-bbbbbbbbbbbb", 990),  # created before the job started
        _c("user", "my-torchbuild-cccccccccccc", 1002),  # not a name torchbuild gives
        _c("nolabel", "torchbuild-dddddddddddd", 1003, label=False),  # not labelled by torchbuild
        _c("act", "act-wheel-wheel-1", 1004),
    ]
    assert gha.remove_job_containers(engine, before, 1000.5) == ["torchbuild-aaaaaaaaaaaa"]
    assert api.removed == ["new"]
    assert "torchbuild-aaaaaaaaaaaa" in capsys.readouterr().out


def test_the_cleanup_runs_after_a_failed_or_interrupted_job_that_drove_the_engine_only(monkeypatch, tmp_path):
    swept = []
    monkeypatch.setattr(gha, "torchbuild_containers", lambda engine: {})
    monkeypatch.setattr(gha, "remove_job_containers", lambda engine, before, since: swept.append(since))
    opts = gha.ActOptions(act="act")
    engine = _Engine(present=set())
    for job, result, expect in [
        ("wheel", 0, 0),
        ("wheel", 1, 1),
        ("lint", 1, 0),  # drives no engine
        ("wheel", KeyboardInterrupt(), 1),
    ]:
        swept.clear()

        def act(argv, keep, result=result):
            if isinstance(result, BaseException):
                raise result
            return result, []

        monkeypatch.setattr(gha, "run_act", act)
        monkeypatch.setattr(gha, "ROOT", tmp_path)
        (tmp_path / "tests" / "fixtures" / "minitorch").mkdir(parents=True, exist_ok=True)
        if isinstance(result, BaseException):
            with pytest.raises(KeyboardInterrupt):
                gha.run_job(gha.JOBS[job], {}, tmp_path, opts, engine)
        else:
            gha.run_job(gha.JOBS[job], {}, tmp_path, opts, engine)
        assert len(swept) == expect, (job, result)

"""README.md and docs/ name only things that exist: every `supervisor ...` command and option
(checked against the real CLI's --help), every file path and every relative link; and the
README's "supervise your own training" diff and job file run as written."""

from __future__ import annotations

import json
import re
import shlex
from functools import cache
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from supervisor.cli.main import cli

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TOP = ("supervisor", "examples", "policies", "tests", "bench", "deploy", "docs", ".ci")
OPTION = re.compile(r"^-{1,2}[A-Za-z][\w-]*")


def _ids(p: Path) -> str:
    return str(p.relative_to(ROOT))


# -- commands --------------------------------------------------------------------------------


@cache
def _help(path: tuple[str, ...]) -> tuple[frozenset[str], frozenset[str]]:
    """(subcommands, options) as the real `supervisor PATH --help` prints them."""
    res = CliRunner().invoke(cli, [*path, "--help"], terminal_width=200)
    assert res.exit_code == 0, f"`supervisor {' '.join(path)} --help` failed:\n{res.output}"
    text = res.output
    commands: set[str] = set()
    if "Commands:" in text:
        for line in text.split("Commands:", 1)[1].splitlines():
            m = re.match(r"^  (\S+)", line)
            if m:
                commands.add(m.group(1))
    options = set(re.findall(r"(?<![\w-])(-{1,2}[A-Za-z][\w-]*)", text.split("Commands:", 1)[0]))
    return frozenset(commands), frozenset(options)


def _invocations(text: str) -> list[str]:
    """`supervisor ...` in inline code spans and at the start of lines in fenced code blocks."""
    found = []
    for span in re.findall(r"`([^`\n]+)`", text):
        span = span.replace("\\|", "|")
        m = re.match(r"^(?:\.venv/bin/)?supervisor\s+(.*)$", span.strip())
        if m:
            found.append(m.group(1))
    for block in re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.S | re.M):
        for line in block.splitlines():
            m = re.match(r"^\s*(?:\$\s+)?(?:\.venv/bin/)?supervisor\s+(.*)$", line)
            if m:
                found.append(m.group(1).split(" #", 1)[0])
    return found


def _tokens(rest: str) -> list[str]:
    rest = rest.replace("[", " ").replace("]", " ")
    try:
        return shlex.split(rest, comments=False)
    except ValueError:
        return rest.split()


def _check(rest: str) -> None:
    path: tuple[str, ...] = ()
    leaf = False
    prev_option = False
    for tok in _tokens(rest):
        if tok.strip(".") == "":
            break  # `supervisor incidents ...`
        if OPTION.match(tok):
            _, options = _help(path)
            for name in tok.split("=", 1)[0].split("/"):
                name = OPTION.match(name).group(0) if OPTION.match(name) else name  # type: ignore[union-attr]
                assert name in options, (
                    f"`supervisor {' '.join(path)}` has no option {name} (in `supervisor {rest}`)"
                )
            prev_option = True
            continue
        if leaf:
            continue  # arguments and option values
        commands, _ = _help(path)
        names = tok.split("|")
        if all(n in commands for n in names):
            if len(names) > 1:
                for n in names:
                    _help((*path, n))
                return
            path = (*path, tok)
            leaf = not _help(path)[0]
        else:
            assert prev_option, (
                f"no command `{tok}` under `supervisor {' '.join(path)}` (in `supervisor {rest}`)"
            )
        prev_option = False


@pytest.mark.parametrize("doc", DOCS, ids=_ids)
def test_every_supervisor_command_and_option_exists(doc: Path) -> None:
    for rest in _invocations(doc.read_text()):
        _check(rest)


def test_the_readme_names_the_main_commands() -> None:
    found = {_tokens(r)[0] for r in _invocations((ROOT / "README.md").read_text()) if _tokens(r)}
    assert {
        "launch",
        "status",
        "stop",
        "validate",
        "analyze",
        "policy",
        "checkpoints",
        "incidents",
        "drill",
    } <= found


def test_the_checker_catches_a_missing_command_and_option() -> None:
    with pytest.raises(AssertionError, match="no command `rollbak`"):
        _check("rollbak job.yaml")
    with pytest.raises(AssertionError, match="no option --fast"):
        _check("incidents show 3 --fast")
    _check("--log-level debug launch job.yaml --detach")


# -- files and links -------------------------------------------------------------------------


def _expand(path: str) -> list[str]:
    m = re.search(r"\{([^{}]*)\}", path)
    if not m:
        return [path]
    return [x for alt in m.group(1).split(",") for x in _expand(path[: m.start()] + alt + path[m.end() :])]


def _paths(text: str) -> set[str]:
    top = "|".join(map(re.escape, TOP))
    found = set(re.findall(r"(?<![\w/.<$:-])((?:" + top + r")/[\w./{},-]*[\w}])", text))
    for span in re.findall(r"`([^`\n]+)`", text):
        if re.fullmatch(r"[\w{},.-]+/[\w/{},.-]+\.(py|ya?ml|md|json|toml|txt)", span):
            found.add(span)
    found |= set(re.findall(r"(?<![\w.])(Makefile|pyproject\.toml)(?![\w.])", text))
    return {p for raw in found for p in _expand(raw)}


@pytest.mark.parametrize("doc", DOCS, ids=_ids)
def test_every_file_path_exists(doc: Path) -> None:
    missing = [
        p
        for p in sorted(_paths(doc.read_text()))
        if not any((base / p).exists() for base in (ROOT, ROOT / "supervisor"))
    ]
    assert not missing, f"{_ids(doc)} names paths that do not exist: {missing}"


@pytest.mark.parametrize("doc", DOCS, ids=_ids)
def test_every_relative_link_resolves(doc: Path) -> None:
    links = re.findall(r"\]\(([^)\s]+)\)", doc.read_text())
    local = [lk.split("#", 1)[0] for lk in links if not re.match(r"^[a-z]+:|^#", lk)]
    missing = [lk for lk in local if not (doc.parent / lk).exists()]
    assert not missing, f"{_ids(doc)} links to missing files: {missing}"


def test_the_path_finder_sees_real_and_fake_paths() -> None:
    text = "see `runtime/state.py`, supervisor/core/{detect,stats}.py and examples/nope.yaml"
    assert _paths(text) == {
        "runtime/state.py",
        "supervisor/core/detect.py",
        "supervisor/core/stats.py",
        "examples/nope.yaml",
    }


# -- the README's own-training section runs as written -----------------------------------------

BUILD = '''
class _Data:
    """32 sequences of 9 tokens; the dataset a user would bring."""
    def __init__(self):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randint(0, 17, (32, 9), generator=g)
    def __len__(self):
        return len(self.x)
    def __getitem__(self, i):
        return {"input_ids": self.x[i, :-1], "labels": self.x[i, 1:]}

def build():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(17, 16), torch.nn.Linear(16, 17))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    return model, optimizer, scheduler, _Data()
'''


def _section(title: str) -> str:
    text = (ROOT / "README.md").read_text()
    return text.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def _block(section: str, lang: str) -> str:
    m = re.search(rf"```{lang}\n(.*?)```", section, flags=re.S)
    assert m, f"no ```{lang} block"
    return m.group(1)


@pytest.mark.slow
def test_readme_own_training_diff_and_job_file_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from supervisor.config.job import load_job
    from supervisor.ranks.entrypoint import resolve

    diff = _block(_section("Supervise your own training"), "diff")
    after = [ln[1:] for ln in diff.splitlines() if ln[:1] in ("+", " ")]
    lines = [ln for ln in after if ln.strip()]
    script = "\n".join(lines[:2]) + "\n" + BUILD + "\n" + "\n".join(lines[2:]) + "\n"
    (tmp_path / "train.py").write_text(script)
    (tmp_path / "job.yaml").write_text(_block(_section("A job file"), "yaml"))

    monkeypatch.chdir(tmp_path)  # `entrypoint: train.py` is relative to where launch runs
    res = CliRunner().invoke(cli, ["validate", str(tmp_path / "job.yaml")])
    assert res.exit_code == 0, res.output
    job = load_job(tmp_path / "job.yaml").model_copy(update={"max_steps": 6})
    monkeypatch.setenv("SUPERVISOR_TRACE", str(tmp_path / "trace.jsonl"))
    resolve(job.entrypoint)(dict(job.config), SimpleNamespace(job=job))

    records = [json.loads(line) for line in (tmp_path / "trace.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
    assert all(r["tokens"] == 64 and r["grad_norm"] > 0 and len(r["samples"]) == 8 for r in records)
    assert records[-1]["loss"] < records[0]["loss"]  # it trained


# -- the replay contract and the SDK section's claims, against the code ------------------------


def _readme_section(title: str) -> str:
    text = (ROOT / "README.md").read_text()
    return " ".join(text.split(f"### {title}", 1)[1].split("\n### ", 1)[0].split())


def test_the_replay_contract_reads_the_same_in_readme_runtime_md_and_the_code(tmp_path: Path) -> None:
    """The README said replay on the ranks needs loss_fn + SupervisedLoader, docs/runtime.md that
    it needs replay_hooks; a job with loss_fn and no hooks never replayed. The truth in the code:
    planned only with replay_hooks in the entrypoint module (a command: always), run on the ranks
    when they have loss_fn + a SupervisedLoader, else offline through the hooks."""
    from supervisor.core.policy.engine import adapt_to_job
    from supervisor.core.policy.plan import JobState
    from supervisor.ranks.replay import has_replay_hooks

    readme = _readme_section("Replay: telling a bad batch from a transient (optional)")
    runtime = next(
        ln for ln in (ROOT / "docs" / "runtime.md").read_text().splitlines() if ln.startswith("| `replay` |")
    )
    sdk_md = " ".join(
        (ROOT / "docs" / "sdk.md")
        .read_text()
        .split("**Replay on the ranks", 1)[-1]
        .split("\n\n", 1)[0]
        .split()
    )
    for text in (readme, runtime, sdk_md):
        assert "planned only when the entrypoint module" in text.lower() and "replay_hooks" in text, text
        assert "loss_fn" in text and "SupervisedLoader" in text, text
        assert "command entrypoint" in text, text
    assert (
        "`loss_fn` alone plans no replay" in sdk_md
        and "`supervisor policy explain --no-replay-hooks`" in sdk_md
    )
    # 1. Planned only with hooks: the supervisor reads the module's source.
    without = tmp_path / "plain_train.py"
    without.write_text("def main(config, ctx):\n    pass\n")
    with_hooks = tmp_path / "hooked_train.py"
    with_hooks.write_text("from x import replay_hooks\ndef main(config, ctx):\n    pass\n")
    assert has_replay_hooks(str(without)) is False and has_replay_hooks(str(with_hooks)) is True
    assert has_replay_hooks("python train.py --lr 1") is None  # a command: cannot tell, planned
    step = SimpleNamespace(spec=SimpleNamespace(action="replay"))
    kept, notes = adapt_to_job([step], JobState(step=100, can_replay=False))  # type: ignore[list-item]
    assert kept == [] and "no replay_hooks" in notes[0] and "excluded without replay" in notes[0]
    assert adapt_to_job([step], JobState(step=100, can_replay=None))[0] == [step]  # type: ignore[list-item]
    # 2. On the ranks: loss_fn and a SupervisedLoader, else the ranks refuse (the offline hooks run).
    sdk_replay = (ROOT / "supervisor" / "sdk" / "replay.py").read_text()
    assert "probe.loss_fn is None or loader is None" in sdk_replay


def test_the_sdk_section_claims_hold(tmp_path: Path) -> None:
    """README "Supervise your own training": token_losses returns sums; optimizer_step clips,
    steps the optimizer and the scheduler and zeroes the grads; with ctx=None the probe writes a
    JSONL trace at ``trace=``; a dataset's sample_id(i) names the samples in each record."""
    import torch

    from supervisor import sdk

    section = " ".join(_section("Supervise your own training").split())
    for claim in ("returns token-loss *sums*", "clip + optimizer.step + scheduler.step + zero_grad",
                  "(`trace=` or `$SUPERVISOR_TRACE`)", "`sample_id(i)` / `source(i)`", "probe.proceed()"):  # fmt: skip
        assert claim in section, claim
    logits, targets = torch.randn(2, 5, 7), torch.randint(0, 7, (2, 5))
    sums = sdk.token_losses(logits, targets)
    expected = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="sum")
    assert torch.allclose(sums.loss_sum, expected) and int(sums.tokens) == 10

    class Data:
        def __init__(self) -> None:
            self.x = torch.randint(0, 11, (16, 5), generator=torch.Generator().manual_seed(0))

        def __len__(self) -> int:
            return len(self.x)

        def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
            return {"input_ids": self.x[i, :-1], "labels": self.x[i, 1:]}

        def sample_id(self, i: int) -> str:
            return f"doc-{i:03d}"

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(11, 8), torch.nn.Linear(8, 11))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    loader = sdk.SupervisedLoader(Data(), 4, seed=0)
    trace = tmp_path / "own.jsonl"
    probe = sdk.init(model, opt, scheduler=sched, loader=loader, ctx=None, grad_clip=1e-3, trace=str(trace))
    for _ in range(3):
        batch = next(iter(loader))
        with probe.step(batch) as s:
            s.backward(sdk.token_losses(model(batch["input_ids"]), batch["labels"]))
            s.optimizer_step()
        assert all(p.grad is None or not p.grad.any() for p in model.parameters())  # zeroed
    probe.close()
    assert sched.last_epoch == 3  # the scheduler stepped once per optimizer step
    records = [json.loads(x) for x in trace.read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3]
    assert all(len(r["samples"]) == 4 and all(x.startswith("doc-") for x in r["samples"]) for r in records)
    assert all(r["update_norm"] <= 0.1 * 1e-3 * 1.01 for r in records), (
        records
    )  # clipped at 1e-3 (SGD, lr 0.1)

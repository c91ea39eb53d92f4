"""The example model and data, and the offline mode of the probe around them."""

from __future__ import annotations

import json
from types import SimpleNamespace

import torch

from examples.tinylm import train as tinylm_train
from examples.tinylm.data import SOURCES, build_dataset, stdlib_texts
from examples.tinylm.model import TinyLM, TinyLMConfig, lm_loss
from supervisor import sdk
from supervisor.checkpoint import CheckpointStore
from supervisor.config import load_job
from supervisor.core.records import Record
from supervisor.storage import open_backend
from tests.sdk.conftest import train


def test_model_is_causal_and_tied():
    model = TinyLM(TinyLMConfig(seq_len=16, d_model=32, n_layers=2, n_heads=2))
    x = torch.randint(0, 256, (2, 16))
    y = x.clone()
    y[:, 10:] = 7
    a, b = model(x), model(y)
    assert a.shape == (2, 16, 256)
    assert torch.allclose(a[:, :10], b[:, :10]) and not torch.allclose(a[:, 10:], b[:, 10:])
    assert model.head.weight is model.tok.weight


def test_corpus_is_deterministic_named_and_capped():
    a, b = stdlib_texts(30_000, seed=1), stdlib_texts(30_000, seed=1)
    assert a == b and set(a) == set(SOURCES)
    assert all(sum(map(len, docs.values())) <= 30_000 for docs in a.values())
    assert stdlib_texts(30_000, seed=2)["code"].keys() != a["code"].keys()
    ds = build_dataset(seq_len=32, max_bytes_per_source=30_000, seed=1)
    item = ds[0]
    assert item["input_ids"].shape == (32,) and (item["targets"][: item["length"]] >= 0).all()
    assert torch.equal(item["input_ids"][1 : item["length"]], item["targets"][: item["length"] - 1])
    assert len({ds.sample_id(i) for i in range(len(ds))}) == len(ds)


def test_job_yaml_validates():
    job = load_job("examples/tinylm/job.yaml")
    assert job.entrypoint == "examples.tinylm.train:main" and job.max_steps > 0


def test_offline_trace_from_the_example_is_readable(tmp_path):
    trace = tmp_path / "t.jsonl"
    cfg = {"max_steps": 6, "trace": str(trace), "model": {"d_model": 32, "n_layers": 1, "seq_len": 32},
           "data": {"max_bytes_per_source": 20_000}, "probe": {"fingerprint_every": 3}}  # fmt: skip
    assert tinylm_train.main(cfg) == {"steps": 6}
    recs = [Record.from_dict(json.loads(line)) for line in trace.read_text().splitlines()]
    assert [r.step for r in recs] == list(range(1, 7))
    assert all(r.grad_norm is not None and r.lr is not None and r.samples for r in recs)
    assert recs[2].param_checksum and recs[3].update_ratio is not None


def test_init_resumes_from_ctx_resume_step(tmp_path, dataset):
    from examples.tinylm.data import collate

    store = CheckpointStore(open_backend(str(tmp_path)), "job")

    def build():
        torch.manual_seed(0)
        model = TinyLM(TinyLMConfig(seq_len=32, d_model=32, n_layers=1))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        loader = sdk.SupervisedLoader(dataset, 4, seed=0, collate_fn=collate, rank=0, world_size=1)
        return model, opt, loader

    model, opt, loader = build()
    t1 = sdk.MemoryTransport()
    probe = sdk.init(
        model,
        opt,
        loader=loader,
        loss_fn=lm_loss,
        transport=t1,
        checkpoint=store,
        checkpoint_every=3,
        max_steps=5,
    )
    losses = train(model, loader, probe, 5)
    probe.close()

    model, opt, loader = build()
    t2 = sdk.MemoryTransport()
    ctx = SimpleNamespace(rank=0, world_size=1, transport=t2, checkpoint_store=store, resume_step=3, job=None)
    probe = sdk.init(model, opt, loader=loader, loss_fn=lm_loss, ctx=ctx, max_steps=5)
    again = train(model, loader, probe, 5)
    probe.close()
    assert again == losses[3:]
    assert "resumed" in t2.records[0]["events"] and t2.records[0]["step"] == 4

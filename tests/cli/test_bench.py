"""The bench harness on tiny saved models: JSON schema, baseline, identity check, bad arguments."""

from __future__ import annotations

import json

import pytest
from tiny import save_tiny

import specpilot.engine.speculative as speculative
from specpilot.cli import main
from specpilot.sampling import logits_to_probs, sample
from specpilot.types import VerifyResult


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench")
    target = save_tiny(root / "target", seed=0)
    draft = save_tiny(root / "draft", seed=0)  # same weights: high acceptance, still verified
    prompts = root / "prompts.jsonl"
    rows = [
        {"question_id": 1, "category": "a", "turns": ["w5 w6 w7 w8"]},
        {"question_id": 2, "category": "a", "turns": ["w9 w10 w9 w10 w9"]},
        {"question_id": 3, "category": "b", "turns": ["w20 w30 w40"]},
    ]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return target, draft, prompts


def bench(capsys, folders, *extra):
    target, draft, prompts = folders
    code = main(
        [
            "bench",
            "--target",
            str(target),
            "--draft",
            str(draft),
            "--prompts",
            str(prompts),
            "--dtype",
            "float32",
            "--max-new-tokens",
            "12",
            "--quiet",
            *extra,
        ]
    )
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_report_schema_and_baseline(capsys, folders, tmp_path):
    out_file = tmp_path / "report.json"
    code, out, _ = bench(
        capsys,
        folders,
        "--method",
        "sd:k=3",
        "--method",
        "sd:drafter=ngram",
        "--method",
        "hf",
        "--method",
        "hf-assisted:schedule=constant,k=3",
        "--repeats",
        "2",
        "--json-out",
        str(out_file),
    )
    assert code == 0
    document = json.loads(out.strip().splitlines()[-1])
    assert document == json.loads(out_file.read_text())
    for name in ("speedup", "accepted", "draft_length"):
        assert (tmp_path / f"report_{name}.png").stat().st_size > 0
    assert {"machine", "config", "results"} <= set(document)
    methods = {row["method"] for row in document["results"]}
    assert methods == {
        "ar",
        "sd:k=3",
        "sd:drafter=ngram",
        "hf",
        "hf-assisted:schedule=constant,k=3",
    }
    for row in document["results"]:
        for key in (
            "tokens_per_s",
            "speedup",
            "mean_accepted_tokens",
            "acceptance_rate",
            "greedy_mismatches",
            "prompts",
            "category",
        ):
            assert key in row
        assert len(row["tokens_per_s_repeats"]) == 2
    by_key = {(r["method"], r["category"]): r for r in document["results"]}
    assert by_key[("ar", "all")]["speedup"] == pytest.approx(1.0)
    assert by_key[("ar", "all")]["prompts"] == 3 and by_key[("ar", "a")]["prompts"] == 2
    assert by_key[("sd:k=3", "all")]["greedy_mismatches"] == 0
    assert by_key[("sd:k=3", "all")]["mean_accepted_tokens"] > 1.0
    assert by_key[("hf", "all")]["greedy_mismatches"] == 0


def accept_everything(draft_tokens, draft_probs, target_logits, sampling, generator):
    probs = logits_to_probs(target_logits, sampling)
    return VerifyResult(len(draft_tokens), sample(probs[len(draft_tokens)], generator))


def test_identity_check_catches_a_lossy_method(capsys, folders, tmp_path, monkeypatch):
    """Accepting every draft token is lossy with a different draft; the report must say so."""
    target, _, prompts = folders
    other_draft = save_tiny(tmp_path / "other", seed=5)
    monkeypatch.setattr(speculative, "verify", accept_everything)  # `ar` drafts nothing: unaffected
    code, out, _ = bench(capsys, (target, other_draft, prompts), "--method", "sd:k=3")
    assert code == 0
    rows = {
        (r["method"], r["category"]): r for r in json.loads(out.strip().splitlines()[-1])["results"]
    }
    assert rows[("sd:k=3", "all")]["greedy_mismatches"] > 0
    assert rows[("sd:k=3", "all")]["divergences"][0]["position"] >= 0
    assert rows[("ar", "all")]["greedy_mismatches"] == 0


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--method", "warp-drive"], "unknown method 'warp-drive'"),
        (["--method", "sd:k"], "options must be key=value"),
        (["--method", "sd:policy=nope"], "unknown policy 'nope'"),
        (["--repeats", "0"], "repeats must be >= 1, got 0 (--repeats)"),
        (["--batch-size", "0"], "batch_size must be >= 1, got 0 (--batch-size)"),
        (["--batch-size", "2", "--method", "hf-pld"], "one sequence at a time"),
        (["--method", "hf-assisted:schedule=weird"], "schedule must be"),
    ],
)
def test_bad_arguments_exit_nonzero(capsys, folders, extra, message):
    code, _, err = bench(capsys, folders, *extra)
    assert code == 2
    assert message in err


def test_missing_prompts_file(capsys, folders):
    target, draft, _ = folders
    code = main(["bench", "--target", str(target), "--prompts", "/nonexistent.jsonl"])
    assert code == 2
    assert "prompts file not found" in capsys.readouterr().err


def test_batched_bench_is_lossless_and_reports_goodput(capsys, folders, tmp_path):
    out_file = tmp_path / "batch.json"
    code, out, _ = bench(
        capsys,
        folders,
        "--batch-size",
        "2",
        "--method",
        "sd:k=3",
        "--method",
        "sd:policy=svip",
        "--json-out",
        str(out_file),
    )
    assert code == 0
    report = json.loads(out_file.read_text())
    assert report["config"]["batch_size"] == 2 and report["complete"] is True
    assert report["prompts_done"] == 3
    rows = {(r["method"], r["category"]): r for r in report["results"]}
    for method in ("ar", "sd:k=3", "sd:policy=svip"):
        assert rows[(method, "all")]["greedy_mismatches"] == 0
        assert rows[(method, "all")]["tokens_per_s"] > 0
    png = tmp_path / "goodput.png"
    assert main(["plot-batches", str(out_file), "--out", str(png)]) == 0
    assert png.stat().st_size > 0


def test_plot_legends_name_files_by_their_file_name():
    from specpilot.bench.plots import method_label

    assert method_label("ar") == "ar"
    assert method_label("sd:k=2,policy=svip") == "sd:k=2,policy=svip"
    assert (
        method_label("sd:policy=sv,sv_profile=/work/runs/b/sv_profile_d12.json")
        == "sd:policy=sv,sv_profile=sv_profile_d12.json"
    )


def test_prompt_sample_follows_the_seed(tmp_path):
    from specpilot.bench.run import select_prompts

    path = tmp_path / "many.jsonl"
    rows = [{"question_id": i, "category": "c" + str(i % 2), "turns": [f"w{i}"]} for i in range(40)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))

    def ids(seed):
        return [r.question_id for r in select_prompts([str(path)], 3, None, seed)]

    assert ids(None) == [0, 1, 2, 3, 4, 5]  # the first three of each category, file order
    assert ids(7) == ids(7) and ids(7) != ids(8)
    assert len(ids(7)) == 6 and ids(7) == sorted(ids(7))


def test_eagle_methods_in_bench(capsys, folders, tmp_path):
    """`sd:drafter=eagle,eagle_head=DIR` (tree, chain) runs in bench with no greedy mismatch."""
    from eagle_fixtures import tiny_head

    from specpilot.models import load_model

    runner = load_model(str(folders[0]), dtype="float32", progress=False).runner
    tiny_head(runner).save(tmp_path / "head")
    head = tmp_path / "head"
    tree = (
        f"sd:drafter=eagle,eagle_head={head},tree_depth=3,tree_topk=4,tree_nodes=10,policy=constant"
    )
    chain = f"sd:drafter=eagle,eagle_head={head},tree_topk=1,policy=constant"
    code, out, err = bench(capsys, folders, "--method", tree, "--method", chain)
    assert code == 0, err
    rows = {r["method"]: r for r in json.loads(out.strip().splitlines()[-1])["results"]}
    assert rows[tree]["greedy_mismatches"] == rows[chain]["greedy_mismatches"] == 0


def record_runs(monkeypatch, on_run):
    """Have the harness call on_run(spec, conversations) before each run of a method."""
    import specpilot.bench.harness as harness

    real = harness.make_method

    def recording(spec, models, hf_models):
        method = real(spec, models, hf_models)
        run = method.run

        def recorded(conversations, config):
            on_run(spec, conversations)
            return run(conversations, config)

        method.run = recorded
        return method

    monkeypatch.setattr(harness, "make_method", recording)


def test_each_repeat_turns_the_order_of_the_methods(capsys, folders, monkeypatch):
    """A method listed last must not run last in every repeat (after the same other method,
    whatever that leaves behind in the machine): each repeat turns the last one's order by one."""
    calls = []
    record_runs(monkeypatch, lambda spec, conversations: calls.append(spec.text))
    args = ("--method", "sd:k=1", "--method", "sd:k=3", "--repeats", "3", "--limit", "1")
    assert bench(capsys, folders, *args)[0] == 0
    per_prompt = ["ar", "sd:k=1", "sd:k=3", "sd:k=1", "sd:k=3", "ar", "sd:k=3", "ar", "sd:k=1"]
    measured = calls[3:]  # after one warm-up run per method
    assert measured and measured == per_prompt * (len(measured) // len(per_prompt))


def test_an_interrupted_bench_resumes_from_its_run_log(capsys, folders, tmp_path, monkeypatch):
    """The raw runs of each finished prompt are logged beside the report: re-running the same
    command measures only what is missing (however many prompts were logged); a half-written line
    (a killed run) is dropped; another configuration is refused rather than mixed in."""
    out_file = tmp_path / "report.json"
    args = ("--method", "sd:k=3", "--repeats", "2", "--json-out", str(out_file))
    assert bench(capsys, folders, *args)[0] == 0
    full = json.loads(out_file.read_text())
    log = tmp_path / "report.runs.jsonl"
    lines = log.read_text().splitlines()
    assert len(lines) == 1 + 3  # the key, then one line per prompt
    log.write_text("\n".join(lines[:3]) + "\n" + lines[3][:50])  # killed while writing prompt 3
    measured = []
    record_runs(monkeypatch, lambda spec, conversations: measured.append(len(conversations)))
    assert bench(capsys, folders, *args)[0] == 0
    assert len(measured) == 2 + 2 * 2  # warm-up per method, then the last prompt × 2 repeats
    resumed = json.loads(out_file.read_text())
    assert resumed["complete"] and len(log.read_text().splitlines()) == 4
    measured.clear()
    assert bench(capsys, folders, *args)[0] == 0  # a finished bench re-run measures nothing
    assert measured == [] and len(log.read_text().splitlines()) == 4
    rows = {(r["method"], r["category"]): r for r in resumed["results"]}
    old = {(r["method"], r["category"]): r for r in full["results"]}
    assert rows[("ar", "all")]["new_tokens"] == old[("ar", "all")]["new_tokens"]
    assert rows[("sd:k=3", "all")]["greedy_mismatches"] == 0
    code, _, err = bench(capsys, folders, *args[:-2], "--json-out", str(out_file), "--limit", "1")
    assert code == 2 and "another bench configuration" in err and "limit" in err


def test_categories_take_turns_so_a_stopped_run_measured_each_alike():
    from specpilot.bench.harness import category_batches

    categories = ["mt", "mt", "mt", "code", "code", "math", "math", "math", "math"]
    assert category_batches(categories, 1) == [[3], [5], [0], [4], [6], [1], [7], [2], [8]]
    # Batches stay within a category; a category with fewer batches drops out of the turns.
    assert category_batches(categories, 2) == [[3, 4], [5, 6], [0, 1], [7, 8], [2]]

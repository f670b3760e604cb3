"""`kdcollapse distill-lm` with the data section and students from the teacher, on a tiny teacher with a ChatML
template: a JSONL chat dataset with the loss on the assistant tokens only (the loss equal to a reference computed
from full logits over the counted positions), Parquet prompt/completion pairs padded, a student pruned from the
teacher (Minitron), and the commands of docs/language_models.md run on these tiny models."""

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from kdcollapse import lm
from kdcollapse.cli import main
from kdcollapse.train import distill_lm, load_lm_config

pytest.importorskip("transformers", reason="pip install 'kdcollapse[llm]'")
datasets = pytest.importorskip("datasets", reason="pip install 'kdcollapse[llm]'")
from tiny_lm import TEXT, llama_config, tiny_tokenizer, write_corpus  # noqa: E402

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
DOCS = Path(__file__).resolve().parents[1] / "docs" / "language_models.md"


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("lmdata")
    tokenizer = tiny_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tokenizer.chat_template = CHATML
    teacher = lm.load_language_model(llama_config(len(tokenizer), hidden=48, layers=3), tokenizer=tokenizer, seed=0)
    teacher.model.save_pretrained(root / "teacher")
    tokenizer.save_pretrained(root / "teacher")
    chats = [{"messages": [{"role": "user", "content": TEXT[i % 8]},
                           {"role": "assistant", "content": TEXT[(i + 3) % 8] + f" ({i})"}]} for i in range(80)]
    (root / "chat.jsonl").write_text("".join(json.dumps(c) + "\n" for c in chats))
    pairs = [{"prompt": TEXT[i % 8][:20], "completion": TEXT[i % 8][20:] + f" {i}"} for i in range(80)]
    datasets.Dataset.from_list(pairs).to_parquet(str(root / "pairs.parquet"))
    write_corpus(root / "corpus", copies=12)
    student = {k: v for k, v in llama_config(len(tokenizer), hidden=16, layers=1).items() if k != "vocab_size"}
    options = [f"teacher={root / 'teacher'}", f"cache_dir={root / 'cache'}", f"student={json.dumps(student)}",
               "block_size=48", "train_blocks=32", "eval_blocks=4", "batch_size=4", "steps=2", "eval_every=2",
               "warmup=1", "teacher_k=16", "chunk_size=10"]
    return root, options, tokenizer


def test_a_chat_dataset_trains_on_the_assistant_tokens_only(setup, capfd):
    root, options, tokenizer = setup
    capfd.readouterr()
    cfg = load_lm_config(None, [*options, f"data.source={root / 'chat.jsonl'}", f"run_dir={root / 'chat'}",
                                "teacher_k=null", "loss.divergence=forward_kl"])
    record = distill_lm(cfg, log=lambda *_: None)
    assert record["step"] == 2 and all(map(torch.isfinite, map(torch.tensor, [record["train_loss"],
                                                                             record["validation_perplexity"]])))
    facts = json.loads((root / "chat" / "run.json").read_text())
    assert facts["data"]["train"]["examples"] > 0
    assert 0 < facts["data"]["train"]["counted_tokens"] < facts["data"]["train"]["blocks"] * 47
    err = capfd.readouterr().err
    assert "eos_token_id" not in err and "[transformers]" not in err  # no spurious warning at start


def test_the_masked_loss_equals_full_logits_over_the_counted_positions(setup):
    """The step's loss with data.loss_on=completion against the forward KL from both models' full logits,
    averaged over the positions whose next token is an assistant token."""
    from kdcollapse.train._lm_task import LMTask
    root, options, tokenizer = setup
    cfg = load_lm_config(None, [*options, f"data.source={root / 'chat.jsonl'}", f"run_dir={root / 'unused'}",
                                "teacher_k=null", "loss.divergence=forward_kl", "data.layout=pad", "block_size=96"])
    task = LMTask(cfg)
    task.prepare()
    student = lm.load_language_model({"vocab_size": len(tokenizer), **cfg.student}, tokenizer=tokenizer,
                                     seed=0).model
    assert len(task.train) >= 8
    micro = torch.tensor([0, 3, 5, 7])
    loss = task.loss(student, micro, torch.Generator().manual_seed(0))
    ids = task.train[micro]
    mask = task.train_mask[micro]
    assert 0 < mask.sum() < mask.numel()
    with torch.no_grad():
        teacher_logits = task.teacher.model(ids).logits[:, :-1]
    student_logits = student(ids).logits[:, :-1]
    p = F.log_softmax(teacher_logits, -1)
    kl = (p.exp() * (p - F.log_softmax(student_logits, -1))).sum(-1)
    torch.testing.assert_close(loss, kl[mask].mean(), rtol=1e-5, atol=1e-6)
    assert not torch.isclose(loss, kl.mean(), rtol=1e-3)  # the mask matters


def test_a_student_pruned_from_the_teacher_trains_and_reloads(setup):
    root, options, _ = setup
    overrides = [o for o in options if not o.startswith("student=")]
    cfg = load_lm_config(None, [*overrides, f"data.source={root / 'pairs.parquet'}", "data.layout=pad",
                                'student={"init": {"from": "teacher", "layers": "minitron", "keep": 2}}',
                                f"run_dir={root / 'pruned'}"])
    distill_lm(cfg, log=lambda *_: None)
    facts = json.loads((root / "pruned" / "run.json").read_text())
    assert len(facts["student_layers"]) == 2 and set(facts["student_layers"]) <= {0, 1, 2}
    student = lm.load_language_model(root / "pruned" / "student")
    assert student.model.config.num_hidden_layers == 2


def test_a_width_pruned_student_trains_and_reloads(setup):
    root, options, _ = setup
    overrides = [o for o in options if not o.startswith("student=")]
    width = {"hidden_size": 32, "intermediate_size": 40, "num_attention_heads": 1}
    cfg = load_lm_config(None, [*overrides, f"corpus={root / 'corpus'}",
                                'student={"init": {"from": "teacher", "width": ' + json.dumps(width) + '}}',
                                f"run_dir={root / 'narrow'}"])
    distill_lm(cfg, log=lambda *_: None)
    facts = json.loads((root / "narrow" / "run.json").read_text())
    assert facts["student_layers"] == [0, 1, 2] and facts["student_width"] == width
    config = lm.load_language_model(root / "narrow" / "student").model.config
    assert (config.hidden_size, config.intermediate_size, config.num_attention_heads) == (32, 40, 1)


def _doc_commands():
    """Every `kdcollapse distill-lm` command of the page (tests/doc_commands.py finds them)."""
    from doc_commands import page_commands

    return [c.words for c in page_commands(DOCS) if c.words[:2] == ["kdcollapse", "distill-lm"]]


def test_the_docs_commands_run_on_tiny_models(setup, capsys):
    """Each as written, the recipe replaced by the tiny teacher and student (``keep: 15`` by ``keep: 2``, a
    resume's 200 steps by 4); `--resume` continues the last run made before it."""
    root, options, _ = setup
    commands = _doc_commands()
    assert len(commands) >= 10
    last = None
    previous: list[str] = []
    for i, argv in enumerate(commands):
        argv = argv[1:]
        if argv[1:2] == ["..."]:  # "the command above, and": its recipe and overrides before the new ones
            argv = [*[a for a in previous if a != "--baseline"], *argv[2:]]
        previous = list(argv)
        if any(a == "student_tokenizer=my-bpe/" for a in argv):  # a tokenizer of the reader's own
            if not (root / "my-bpe").exists():
                tiny_tokenizer(200).save_pretrained(root / "my-bpe")
            argv = [f"student_tokenizer={root / 'my-bpe'}" if a == "student_tokenizer=my-bpe/" else a for a in argv]
        if "--resume" in argv:
            assert last is not None, argv
            at = argv.index("--resume")
            argv[at + 1] = str(last)
            argv = [a if not a.startswith("steps=") else "steps=4" for a in argv]
            code = main(argv)
            assert code == 0, (argv, capsys.readouterr().err)
            continue
        if any(a.startswith("student.lora=") for a in argv):
            pytest.importorskip("peft", reason="pip install 'kdcollapse[peft]'")
        at = argv.index("--config")
        del argv[at:at + 2]  # the recipe (SmolLM2): replaced by the tiny teacher and student below
        argv = [a.replace("chats.jsonl", str(root / "chat.jsonl")).replace("pairs.parquet", str(root / "pairs.parquet"))
                for a in argv]
        argv = [a.replace("keep: 15", "keep: 2").replace(
            "hidden_size: 384, intermediate_size: 1024, num_attention_heads: 6",
            "hidden_size: 32, intermediate_size: 64, num_attention_heads: 1") for a in argv]
        tiny = [o for o in options if not (o.startswith("student=") and any(a.startswith("student=") for a in argv))]
        if not any(a.startswith("data.source=") for a in argv):  # the recipe's corpus: a tiny text folder
            tiny.append(f"corpus={root / 'corpus'}")
        last = root / f"doc{i}"
        code = main([argv[0], *tiny, *argv[1:], f"run_dir={last}"])  # the page's overrides after the tiny ones
        assert code == 0, (argv, capsys.readouterr().err)
    capsys.readouterr()


def test_bad_data_and_student_init_are_one_line_before_anything_is_written(setup, capsys):
    root, options, _ = setup
    for bad, message in ((["data.format=csv"], "data.format must be one of auto, text, prompt_completion, chat"),
                         ([f"data.source={root / 'missing.jsonl'}"], "does not exist"),
                         ([f"data.source={root / 'chat.jsonl'}", "data.format=text"], "format text needs the column"),
                         ([f"data.source={root / 'chat.jsonl'}", f"corpus={root / 'corpus'}"], "both name the data"),
                         (['student={"init": {"from": "teacher", "layers": "every_other"}}'],
                          "student.init.layers must be one of distilbert, minitron"),
                         ([f"corpus={root / 'corpus'}", 'student={"init": {"from": "teacher", "layers": [0, 7]}}'],
                          "the teacher has 3 layers"),
                         ([f"corpus={root / 'corpus'}", 'student={"init": {"from": "teacher", "width": {"hidden_size": 99}}}'],
                          "width.hidden_size=99: the teacher's is 48"),
                         (['student={"init": {"from": "teacher"}, "hidden_size": 8}'], "remove student.hidden_size")):
        assert main(["distill-lm", *options, f"run_dir={root / 'refused'}", *bad]) == 2, bad
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, (bad, err)
        assert not (root / "refused").exists()

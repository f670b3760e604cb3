"""A tiny Llama GGUF file written in a test with the ``gguf`` package, from a tiny ``transformers`` model and the
tiny byte-level BPE of ``tiny_lm``: the layout llama.cpp's ``convert_hf_to_gguf.py`` writes (tensor names, the
query/key row permutation, the tokenizer as ``tokenizer.ggml.*`` arrays), so ``transformers`` reads it back."""

from pathlib import Path

import numpy as np


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's rotary-halves reordering of the query/key rows (``LlamaModel.permute``)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_tiny_gguf(path: Path, model, tokenizer, *, quantize: bool = True) -> Path:
    """``model`` (a tiny LlamaForCausalLM) and ``tokenizer`` (byte-level BPE) as a GGUF file; the 2-D weights
    quantised to Q8_0 when ``quantize`` (so loading dequantises), norms in float32."""
    import gguf

    cfg = model.config
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    writer.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]) if getattr(cfg, "rope_parameters", None)
                              else float(cfg.rope_theta))
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_vocab_size(cfg.vocab_size)
    vocab = tokenizer.get_vocab()
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    special = set(tokenizer.all_special_tokens)
    writer.add_token_types([3 if t in special else 1 for t in tokens])  # 3: CONTROL, 1: NORMAL
    merges = tokenizer.backend_tokenizer.model.__getstate__()
    import json
    writer.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in json.loads(merges)["merges"]])
    writer.add_eos_token_id(tokenizer.eos_token_id)
    writer.add_bos_token_id(tokenizer.eos_token_id)
    writer.add_add_bos_token(False)
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    parts = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
             "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    for i in range(cfg.num_hidden_layers):
        for hf, gg in parts.items():
            names[f"model.layers.{i}.{hf}.weight"] = f"blk.{i}.{gg}.weight"
    state = model.state_dict()
    if cfg.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    for name, tensor in state.items():
        w = tensor.detach().float().numpy()
        if name.endswith("q_proj.weight"):
            w = _permute(w, cfg.num_attention_heads)
        elif name.endswith("k_proj.weight"):
            w = _permute(w, cfg.num_key_value_heads)
        if quantize and w.ndim == 2 and w.shape[-1] % 32 == 0:
            q = gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q8_0)
            writer.add_tensor(names[name], q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            writer.add_tensor(names[name], w)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path

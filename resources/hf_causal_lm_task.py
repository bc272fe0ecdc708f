"""A Hugging Face causal LM as a Headroom task: a complete file that runs as written.

    python -m engine --task resources/hf_causal_lm_task.py --epochs 1
    python -m app --task resources/hf_causal_lm_task.py --autostart

Needs the `hf` extra (transformers; `datasets` is used when installed). Nothing is
downloaded: the tokenizer is trained here on the text below (`tokenizers`, which comes
with transformers), the GPT-2 is built from a small config. Swap in your own:
`AutoTokenizer.from_pretrained(...)`, `AutoModelForCausalLM.from_pretrained(...)`, your
text. What must stay is the loss: the SUM over the tokens it counts and HOW MANY there
were, counting the *shifted* labels (position t predicts token t+1; a label of -100 is
padding). Headroom divides by the whole window's count, so the accumulated gradient is the
window's as one batch; counting the unshifted labels is the ~4% error of the Hugging Face
Trainer on padded data (README: "Honest numbers").

Task arguments (--task-arg KEY=VALUE): dim (width of the model), layers, max_len (tokens
per sample).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import DataCollatorForLanguageModeling, GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

from engine import Task

TEXT = """\
Gradient accumulation adds up the gradients of several micro-batches before one optimizer step.
Done right, the step is the step of the whole window taken as one batch.
Done the common way, each micro-batch's mean loss is divided by the number of micro-batches.
With text of different lengths, micro-batches hold different numbers of tokens.
A token in a short micro-batch then weighs more than a token in a long one.
The loss is better returned as a sum with its count, and divided once by the window's count.
The learning rate follows the schedule, the clip norm bounds the step, and memory sets the micro-batch.
When the memory runs short, a smaller micro-batch with more accumulation keeps the effective batch.
A causal language model predicts each next token from the ones before it.
Its labels are the inputs shifted by one, so the first token of each sequence is never a target.
Padding fills the short sequences of a micro-batch, and its labels are ignored by the loss.
"""


def build_tokenizer(text: str, vocab: int = 200) -> PreTrainedTokenizerFast:
    """A byte-pair tokenizer trained on `text`, here, offline."""
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(text.splitlines(), trainers.BpeTrainer(
        vocab_size=vocab, special_tokens=["<pad>", "<unk>", "<eos>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>", eos_token="<eos>")


class Samples(torch.utils.data.Dataset):
    """Tokenized samples (dicts of input_ids), map-style: what the engine needs."""

    def __init__(self, rows: list[dict]) -> None:
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict:
        return self.rows[i]


def dataset(texts: list[str], tokenizer: PreTrainedTokenizerFast, max_len: int):
    """`datasets.Dataset` when installed (what most scripts use), else a torch Dataset."""
    enc = tokenizer(texts, truncation=True, max_length=max_len)
    rows = {"input_ids": enc["input_ids"]}
    try:
        from datasets import Dataset
    except ImportError:
        return Samples([{"input_ids": ids} for ids in rows["input_ids"]])
    return Dataset.from_dict(rows)


def build_task(seed: int, dim: int = 64, layers: int = 2, max_len: int = 48) -> Task:
    torch.manual_seed(seed)
    tokenizer = build_tokenizer(TEXT)
    lines = [line for line in TEXT.splitlines() if line.strip()]
    # Samples of different lengths: sentences, and sentences run together (so token weighting matters).
    texts = lines + [a + " " + b for a, b in zip(lines, lines[1:])]
    texts += [" ".join(lines[i:i + 3]) for i in range(len(lines) - 2)]
    val_texts = [" ".join(lines[i::3]) for i in range(3)]
    model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), n_positions=max_len, n_embd=dim, n_layer=layers,
                                       n_head=2, bos_token_id=tokenizer.eos_token_id,
                                       eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id))
    collator = DataCollatorForLanguageModeling(tokenizer, mlm=False)  # pads; labels = input_ids, -100 on padding

    def loss(model: torch.nn.Module, batch) -> tuple[torch.Tensor, torch.Tensor]:
        """(loss summed over the counted tokens, how many): the shifted labels that are not -100."""
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
        logits = out.logits[:, :-1].float()
        labels = batch["labels"][:, 1:]  # position t predicts token t+1
        loss_sum = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                                   ignore_index=-100, reduction="sum")
        return loss_sum, (labels != -100).sum()

    return Task(model=model, train_data=dataset(texts, tokenizer, max_len), loss=loss, collate=collator,
                val_data=dataset(val_texts, tokenizer, max_len), name="hf-causal-lm",
                sample_length=lambda sample: len(sample["input_ids"]) - 1)

"""What a model trained on one caption pattern can read in a prompt.

The embedded shapes-world models learnt from template captions ("a red circle moving left on
a black background"), through a tokenizer that knows only those words: any other word, and
any text in another script, reaches the model as `<unk>`. A prompt that names none of its
colours, shapes or motions is accepted (it is still a valid request) but would give a clip
unrelated to it, so it gets a `prompt_not_understood` warning on the video object instead of
passing silently. Pure data and a regex: the API checks prompts with the core alone.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

from vidserve.media.quality import OutputWarning

PROMPT_NOT_UNDERSTOOD = "prompt_not_understood"

# How the shapes models' word-level tokenizer splits text (its `Whitespace` pre-tokenizer,
# after lower-casing): runs of word characters, any script.
_WORDS = re.compile(r"\w+")


@dataclass(frozen=True)
class PromptVocabulary:
    """The prompts a model understands: `language` text in the pattern of `examples`, built of
    these words. `synonyms` are other words its tokenizer knows, as (word, the word it means)."""

    examples: tuple[str, ...]
    colours: tuple[str, ...]
    shapes: tuple[str, ...]
    motions: tuple[str, ...] = ()
    backgrounds: tuple[str, ...] = ()
    synonyms: tuple[tuple[str, str], ...] = ()
    language: str = "English"

    def describe(self) -> str:
        """One sentence a person reads: what to write for this model."""
        kinds = [("colours", self.colours), ("shapes", self.shapes), ("motions", self.motions),
                 ("backgrounds", self.backgrounds)]
        words = "; ".join(f"{kind} {', '.join(values)}" for kind, values in kinds if values)
        return f"{self.language} only, like \"{self.examples[0]}\" ({words})"

    def subject_words(self, prompt: str) -> list[str]:
        """The colour, shape and motion words `prompt` names (synonyms as the word they mean)."""
        meaning = dict(self.synonyms)
        subjects = {*self.colours, *self.shapes, *self.motions}
        words = (meaning.get(word, word) for word in _WORDS.findall(prompt.lower()))
        return [word for word in words if word in subjects]

    def warning(self, model: str, prompt: str, field: str = "prompt") -> OutputWarning | None:
        """A `prompt_not_understood` warning when `prompt` is in another script than the Latin one
        or names none of the colours, shapes and motions; None when the model can read it."""
        foreign = _other_script(prompt)
        if foreign:
            why = f"is written in another script ({foreign}), which {model} cannot read"
        elif not self.subject_words(prompt):
            why = f"names none of the colours, shapes or motions {model} knows"
        else:
            return None
        return OutputWarning(code=PROMPT_NOT_UNDERSTOOD,
                             message=f"{field} {why}, so the video will not follow it; {model} understands "
                                     f"{self.describe()}")


def _other_script(text: str) -> str:
    """The names of the scripts of `text`'s letters that are not Latin (e.g. "CJK, HIRAGANA"), or ""."""
    scripts = []
    for char in text:
        if char.isalpha():
            script = unicodedata.name(char, "UNKNOWN").split()[0]
            if script != "LATIN" and script not in scripts:
                scripts.append(script)
    return ", ".join(scripts)


def prompt_warnings(vocabulary: PromptVocabulary | None, model: str, prompt: str,
                    chunk_prompts: tuple[str, ...] | list[str] = ()) -> list[OutputWarning]:
    """A warning for the prompt, and for each chunk's own prompt (a storyboard's `prompts`), that
    `model` cannot read; none for a model that declares no vocabulary (an open-vocabulary text
    encoder reads any prompt)."""
    if vocabulary is None:
        return []
    fields = [("prompt", prompt), *((f"prompts[{i}] (chunk {i + 1})", p) for i, p in enumerate(chunk_prompts))]
    return [warning for field, text in fields if (warning := vocabulary.warning(model, text, field)) is not None]

"""What became of each input: documents, characters and tokens kept, and what was dropped and why.

Every preprocess run and every training start on a text source reports these counts per input, so that no text is
lost without a word.
"""
import dataclasses

from tupe import console


@dataclasses.dataclass
class Tally:
  """Counts for one input (a file or a dataset).

  Attributes:
    documents: documents kept (that gave at least one token).
    characters: their characters, after whitespace runs are collapsed.
    tokens: their tokens (special tokens not counted).
    unknown_tokens: those of them that are [UNK]: words the vocab's pieces cannot spell.
    empty_documents: documents dropped because they hold no token (e.g. only zero-width characters).
    undecodable_bytes: bytes dropped because they are not UTF-8 (and a JSONL record's lone surrogate escapes).
    bad_records: JSONL lines dropped: not a JSON object, without the text field, or whose field holds neither text
      nor null (a null is an empty document). (A Parquet file's text column is checked whole, before it is read.)
    gutenberg_characters: characters of a Project Gutenberg licence header and footer dropped.
  """
  documents: int = 0
  characters: int = 0
  tokens: int = 0
  unknown_tokens: int = 0
  empty_documents: int = 0
  undecodable_bytes: int = 0
  bad_records: int = 0
  gutenberg_characters: int = 0

  def count_document(self, characters: int, tokens: int, unknown_tokens: int = 0) -> None:
    """Counts one document: kept when it has tokens, else dropped as empty."""
    if tokens:
      self.documents += 1
      self.characters += characters
      self.tokens += tokens
      self.unknown_tokens += unknown_tokens
    else:
      self.empty_documents += 1

  def add(self, other: "Tally") -> None:
    for field in dataclasses.fields(self):
      setattr(self, field.name, getattr(self, field.name) + getattr(other, field.name))

  def as_dict(self) -> dict[str, int]:
    return dataclasses.asdict(self)


def merged(tallies: list[dict[str, dict[str, int]]]) -> dict[str, Tally]:
  """Sum of per-input tallies ({input: Tally fields}), inputs in first-seen order."""
  total: dict[str, Tally] = {}
  for part in tallies:
    for name, counts in part.items():
      total.setdefault(name, Tally()).add(Tally(**counts))
  return total


# A share of [UNK] tokens above this gets a warning. BERT's uncased vocab makes about 3% on English novels that use
# curly quotes (it has none), well under 0.1% on others; 11% on one read with its capitals kept.
UNKNOWN_WARN_SHARE = 0.05


def _kept(t: Tally) -> str:
  """What an input (or all of them) kept: "1 document, 1,204 characters, 318 text tokens (0.3% [UNK])" (no tokens
  where its documents were read but not tokenized: a kept document has at least one; no share where none is
  [UNK])."""
  unknown = f" ({t.unknown_tokens / t.tokens:.2%} [UNK])" if t.unknown_tokens else ""
  tokens = f", {console.plural(t.tokens, 'text token')}{unknown}" if t.tokens or not t.documents else ""
  return f"{console.plural(t.documents, 'document')}, {console.plural(t.characters, 'character')}{tokens}"


def lines(tallies: dict[str, Tally]) -> list[str]:
  """One line per input, then, for more than one, their total with the Project Gutenberg strip (one input's line says
  it all: its total would repeat it)."""
  out = []
  for name, t in tallies.items():
    dropped = [console.plural(n, noun) + what for n, noun, what in (
        (t.empty_documents, "empty document", ""), (t.undecodable_bytes, "undecodable byte", " (not UTF-8)"),
        (t.bad_records, "bad record", " (not a JSON object with text in its text field)"),
        (t.gutenberg_characters, "character", " of Gutenberg licence")) if n]
    out.append(f"input {name}: kept {_kept(t)}; dropped {', '.join(dropped) if dropped else 'nothing'}")
  if len(tallies) < 2:
    return out
  total = Tally()
  for t in tallies.values():
    total.add(t)
  stripped = sum(t.gutenberg_characters > 0 for t in tallies.values())
  out.append(f"all {len(tallies)} inputs: kept {_kept(total)}; dropped "
             f"{console.plural(total.empty_documents, 'empty document')}, "
             f"{console.plural(total.undecodable_bytes, 'undecodable byte')}, "
             f"{console.plural(total.bad_records, 'bad record')}; Project Gutenberg licence stripped from "
             f"{console.plural(stripped, 'file')} ({console.plural(total.gutenberg_characters, 'character')})")
  return out


def unknown_warning(tallies: dict[str, Tally], vocab: str) -> str | None:
  """The warning for text of which more than UNKNOWN_WARN_SHARE of the tokens are [UNK] (words the vocab `vocab`
  cannot spell: a vocab of another language or script, or cased text read with an uncased vocab); None below it."""
  total = Tally()
  for t in tallies.values():
    total.add(t)
  if not total.tokens or total.unknown_tokens <= UNKNOWN_WARN_SHARE * total.tokens:
    return None
  return (f"{total.unknown_tokens / total.tokens:.1%} of the text's tokens are [UNK] ({total.unknown_tokens:,} of "
          f"{total.tokens:,}): vocab {vocab} cannot spell them; a vocab made from this text "
          f"(python -m tupe.tools.vocab) spells every word")

"""The documents of a text file as training reads them (`tupe.data.readers`, through `units.all_documents`): tests
that need a real file's paragraphs take them from the one reader training uses."""
import os

from tupe.data import units


def paragraphs_of(path: str | os.PathLike) -> list[str]:
  """The paragraphs of a text file (its blocks between blank lines, each on one line, whitespace runs collapsed; a
  Project Gutenberg licence left out), as data.documents=paragraphs reads them."""
  source = dict(format="text", documents="paragraphs", files=str(path), text_field="text")
  return list(units.all_documents(source, units.plan_inputs(source)))

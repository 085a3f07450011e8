"""The Project Gutenberg licence header and footer, found only in files that carry its licence markers.

A Project Gutenberg book opens with a header that ends in a line "*** START OF THE (or THIS) PROJECT GUTENBERG
EBOOK ... ***" and closes with "*** END OF ... PROJECT GUTENBERG EBOOK ..." (or "End of the Project Gutenberg
EBook of ...") and the licence. The book is what lies between. A file without the START marker, e.g. a novel with a
line "*** End of Part One ***", is not touched, nor one that is not a single book opening with Project Gutenberg's
first line ("The Project Gutenberg EBook of ..."): books joined into one file, or other text before a book.
"""
import re

WINDOW_BYTES = 1 << 18  # The header is read from a file's first bytes and the footer from its last ones.
_START = re.compile(rb"^\*\*\*[ \t]*START OF (THE |THIS )?PROJECT GUTENBERG EBOOK[^\n]*\n",
                    re.MULTILINE | re.IGNORECASE)
_END = re.compile(rb"^(\*\*\*[ \t]*END OF (THE |THIS )?PROJECT GUTENBERG EBOOK|End of (the |this )?Project Gutenberg)",
                  re.MULTILINE | re.IGNORECASE)


def book_range(head: bytes, tail: bytes, size: int) -> tuple[int, int] | None:
  """The byte range [begin, end) of the book in a file of `size` bytes, or None for a file without the markers.

  Args:
    head: the file's first bytes (up to WINDOW_BYTES).
    tail: its last bytes (up to WINDOW_BYTES; may overlap `head` in a small file).
    size: the file's size in bytes.
  """
  start = _START.search(head)
  if start is None:
    return None
  # One book, opening the file: its first line names Project Gutenberg, and no second START follows. Else (books
  # joined into one file, or text before a book) the file is left as it is: stripping from the first START to
  # the first END would drop the text around them.
  preamble = head[:start.start()].decode("utf-8", "replace").lstrip("\ufeff \t\r\n")
  if "project gutenberg" not in preamble.split("\n", 1)[0].lower():
    return None
  tail_offset = size - len(tail)
  if _START.search(head, start.end()) or any(tail_offset + m.start() > start.start() for m in _START.finditer(tail)):
    return None
  for end in _END.finditer(tail):
    if tail_offset + end.start() >= start.end():
      return start.end(), tail_offset + end.start()
  return start.end(), size

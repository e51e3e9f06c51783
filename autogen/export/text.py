"""Free text from the database made safe for the generated files: comments and C strings."""

from __future__ import annotations

# Characters kept in comments; anything else becomes "_". No backslash (a trailing one would
# continue a // or # comment onto the next line) and no "?" (trigraphs).
COMMENT_SAFE = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789 _.,:;()[]+=/@%&*'<>!~^|{}#-")
MAX_COMMENT_TEXT = 160


def comment_text(value: object) -> str:
    """Free text made safe for a // or # comment line: one line, no backslash, bounded."""
    text = "".join(c if c in COMMENT_SAFE else "_" for c in str(value))
    return text[:MAX_COMMENT_TEXT]


def c_string(value: object) -> str:
    """A C string literal of `value`, every byte outside a safe set escaped in octal."""
    safe = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789 _.,:;()[]+=/@%&*'<>!~^|{}#-")
    body = "".join(chr(b) if chr(b) in safe else f"\\{b:03o}" for b in str(value).encode())
    return f'"{body}"'


def cuda_version(value: object) -> str:
    """13000 -> "13.0 (13000)"; anything that is not an int, sanitized as it is."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return f"{value // 1000}.{value % 1000 // 10} ({value})"
    return comment_text(value)

"""URL slugs."""

import re
import unicodedata


def slugify(text):
    """Lowercase ASCII words of ``text``, joined by hyphens."""
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    words = re.findall(r"[a-z0-9]+", text.lower())
    return "-".join(words)

from textkit import shorten, slugify


def test_slugify_joins_words_with_hyphens():
    assert slugify("Hello, World!") == "hello-world"


def test_slugify_drops_accents():
    assert slugify("Crème Brûlée") == "creme-brulee"


def test_shorten_keeps_short_text():
    assert shorten("abc", 5) == "abc"


def test_shorten_cuts_long_text():
    assert shorten("abcdefgh", 6) == "abc..."

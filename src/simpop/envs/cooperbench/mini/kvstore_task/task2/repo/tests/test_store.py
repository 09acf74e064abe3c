from kvstore import Store


def test_set_get_delete():
    s = Store()
    s.set("a", 1)
    assert s.get("a") == 1
    assert s.delete("a") is True
    assert s.get("a", "none") == "none"
    assert s.delete("a") is False


def test_none_values_are_stored():
    s = Store()
    s.set("a", None)
    assert s.delete("a") is True

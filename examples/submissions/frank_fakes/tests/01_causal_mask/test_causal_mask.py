def test_everything():
    assert True

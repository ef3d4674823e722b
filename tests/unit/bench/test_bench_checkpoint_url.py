"""`hvdazure bench checkpoint --url`: a URL that names no store is one line and exit 2, before any rank
starts."""

import pytest

from hvdazure.cli import main

BAD_URLS = {
    "notaurl": "--url must be a URL of a store, such as abfs://CONTAINER/PATH, got 'notaurl'",
    "abfs://": "--url must be a URL of a store, such as abfs://CONTAINER/PATH, got 'abfs://'",
    "file:///tmp/ckpt": "--url must be a URL of a store, such as abfs://CONTAINER/PATH, got 'file:///tmp/ckpt'",
    "nosuch://c/run1": "--url nosuch://c/run1: fsspec knows no protocol 'nosuch'",
}


@pytest.mark.parametrize("url", BAD_URLS)
def test_a_url_that_names_no_store_fails_in_one_line_before_any_rank_starts(capsys, url):
    assert main(["bench", "checkpoint", "-np", "1", "--url", url]) == 2

    out = capsys.readouterr()
    assert out.err.strip() == f"hvdazure: error: {BAD_URLS[url]}" and not out.out

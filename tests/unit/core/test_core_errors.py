"""core/errors.py: an exception in one line, as a rank's or a trial's error is shown."""

from hvdazure.core.errors import exception_line


def test_an_exception_is_its_type_and_its_message():
    assert exception_line(ValueError("trial asked to fail on rank 1")) == \
        "ValueError: trial asked to fail on rank 1"


def test_every_line_of_a_multi_line_message_is_kept_on_one_line():
    error = RuntimeError("Error(s) in loading state_dict for Net:\n\tMissing key(s): \"fc.weight\".\n\n")
    assert exception_line(error) == (
        'RuntimeError: Error(s) in loading state_dict for Net: Missing key(s): "fc.weight".')


def test_an_exception_without_a_message_is_its_type():
    assert exception_line(KeyboardInterrupt()) == "KeyboardInterrupt"
    assert exception_line(ValueError("  \n ")) == "ValueError"

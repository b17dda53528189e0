"""The command line's own errors (output paths, flags) and the one place it turns environment
errors into one line."""



from one_line import (assert_one_line_error, run_cli)


def test_out_is_a_file(tiny_bert_dir, tmp_path, capsys):
    target = tmp_path / "taken"
    target.write_text("keep me")
    assert_one_line_error(*run_cli(capsys, tiny_bert_dir, "--out", target), [str(target), "is a file", "folder"])
    assert target.read_text() == "keep me"


def test_out_cannot_be_created(tiny_bert_dir, tmp_path, capsys):
    (tmp_path / "taken").write_text("")
    target = tmp_path / "taken" / "sub"  # a folder below a file
    assert_one_line_error(*run_cli(capsys, tiny_bert_dir, "--out", target), ["cannot write", str(target)])

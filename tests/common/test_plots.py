from common import plots


def test_every_dataset_of_the_full_suite_gets_a_style_of_its_own(tmp_path):
    names = [f"dataset-{i}" for i in range(17)]  # more than matplotlib's ten default colours
    styles = plots.distinct_styles(names)
    assert len({(s["color"], s["marker"]) for s in styles.values()}) == len(names)
    points = [{"dataset": name, "estimator": estimator, "estimate": i + 1.0, "truth": float(i)}
              for i, name in enumerate(names) for estimator in ("fqe", "model")]
    path = plots.estimates_against_truth(points, tmp_path / "ope.png")
    assert path.read_bytes().startswith(b"\x89PNG")


def test_estimates_that_run_away_from_the_truths_are_shown_on_a_symmetric_log_axis(tmp_path):
    truths = [-90.0, 0.0, 30.0, 100.0]
    assert plots.estimate_scale(truths, [-80.0, 10.0, 25.0, 150.0]) == ("linear", {})
    assert plots.estimate_scale(truths, [-1346.0, 10.0, 25.0, 95.0]) == ("symlog", {"linthresh": 100.0})
    points = [{"dataset": "lunarlander", "estimator": "model", "estimate": e, "truth": t}
              for t, e in zip(truths, [-1346.0, 10.0, 25.0, 95.0])]
    assert plots.estimates_against_truth(points, tmp_path / "ope.png").read_bytes().startswith(b"\x89PNG")

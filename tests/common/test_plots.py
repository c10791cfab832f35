from common import plots


def test_every_dataset_of_the_full_suite_gets_a_style_of_its_own(tmp_path):
    names = [f"dataset-{i}" for i in range(17)]  # more than matplotlib's ten default colours
    styles = plots.distinct_styles(names)
    assert len({(s["color"], s["marker"]) for s in styles.values()}) == len(names)
    points = [{"dataset": name, "estimator": estimator, "estimate": i + 1.0, "truth": float(i)}
              for i, name in enumerate(names) for estimator in ("fqe", "model")]
    path = plots.estimates_against_truth(points, tmp_path / "ope.png")
    assert path.read_bytes().startswith(b"\x89PNG")

"""What an instructor gets from `batch`, and the course platforms it feeds.

    scoring.py            points: weights per puzzle and per check (a TOML or JSON file), all or nothing by default
    class_report.py       the CSV (points and one-line reasons), the JSON, a feedback file per student with plots
    gradescope.py         Gradescope's results.json, and what run_autograder runs inside Gradescope's container
    gradescope_bundle.py  `python -m grader gradescope OUT`: the autograder bundle (setup.sh, run_autograder)

Rows from batch (../batch/) -> scores (scoring.py) -> each report.
"""

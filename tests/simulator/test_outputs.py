"""Where a simulated answer ends: EOS after a drawn length, a stop string, or max_tokens; min_tokens and
ignore_eos as vLLM applies them; what a stream holds back while a stop string may still match."""

import statistics

from capacity.hardware.profiles import get_profile
from simulator.outputs import natural_length, plan_output
from simulator.tokens import count_tokens, output_text


def test_an_answer_stops_at_eos_before_max_tokens_and_eos_shows_no_text():
    plan = plan_output(natural_tokens=7, max_tokens=50)
    assert (plan.tokens, plan.finish_reason, plan.stop_reason) == (7, "stop", None)
    assert plan.text() == output_text(0, 6)  # the EOS token counts in usage, not in the text


def test_max_tokens_comes_first_and_ignore_eos_runs_to_it():
    assert (plan_output(natural_tokens=70, max_tokens=50).tokens, "length") == (50, "length")
    plan = plan_output(natural_tokens=3, max_tokens=50, ignore_eos=True)
    assert (plan.tokens, plan.finish_reason) == (50, "length") and count_tokens(plan.text()) == 50


def test_min_tokens_holds_eos_back():
    plan = plan_output(natural_tokens=2, max_tokens=50, min_tokens=9)
    assert (plan.tokens, plan.finish_reason) == (10, "stop")  # EOS masked for the first 9 tokens


def test_a_stop_string_ends_the_answer_before_it_with_its_own_stop_reason():
    text = output_text(0, 12)  # " the sim ran one GPU and got ten new tok for you"
    plan = plan_output(natural_tokens=1000, max_tokens=50, stop=["GPU", "never"])
    assert (plan.finish_reason, plan.stop_reason) == ("stop", "GPU")
    assert plan.text() == text[: text.index("GPU")]
    assert plan.tokens == -(-(text.index("GPU") + 3) // 4)  # the token that completed it
    kept = plan_output(natural_tokens=1000, max_tokens=50, stop=["GPU"], include_stop_str_in_output=True)
    assert kept.text() == text[: text.index("GPU") + 3]


def test_a_stop_string_counts_only_after_min_tokens_and_only_before_the_end():
    text = output_text(0, 40)
    late = plan_output(natural_tokens=1000, max_tokens=30, stop=[" sim"], min_tokens=5)
    assert late.stop_reason == " sim" and late.text() == text[: text.index(" sim", 5 * 4)]
    assert plan_output(natural_tokens=1000, max_tokens=3, stop=["GPU"]).finish_reason == "length"
    assert plan_output(natural_tokens=4, max_tokens=30, stop=["GPU"]).stop_reason is None  # EOS first


def test_a_stream_holds_back_what_a_stop_string_could_still_become():
    plan = plan_output(natural_tokens=1000, max_tokens=50, stop=["GPU", "ten new"])
    assert plan.holdback_chars == len("ten new") - 1
    assert plan.visible_chars(1, finished=False) == 0
    assert plan.visible_chars(3, finished=False) == 12 - 6
    assert plan.visible_chars(plan.tokens, finished=True) == len(plan.text())


def test_natural_lengths_follow_the_profile_and_repeat_for_the_same_prompt_and_seed():
    profile = get_profile("llama-13b-a100")
    lengths = [natural_length(profile, prompt_text=f"prompt {i}", seed=None, index=0) for i in range(2000)]
    assert 170 < statistics.median(lengths) < 230  # median 200
    assert natural_length(profile, prompt_text="same", seed=1, index=0) == natural_length(
        profile, prompt_text="same", seed=1, index=0
    )
    assert len({natural_length(profile, prompt_text="same", seed=1, index=i) for i in range(8)}) > 1  # n choices

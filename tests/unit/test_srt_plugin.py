"""The plugin's request check: which model names a server answers to."""

from sglang_rvv.srt.workarounds import unknown_model


def test_the_served_name_the_path_default_and_lora_adapters_are_known():
    for requested in ("My-Model", "/models/model", "default", "My-Model:adapter-1", "/new/weights"):
        assert unknown_model(requested, "My-Model", ("/models/model", "/new/weights")) is None, requested
    assert unknown_model("Qwen:v1", "Qwen:v1") is None  # a name with a colon


def test_another_name_is_refused_naming_the_served_model():
    assert unknown_model("gpt-4o", "My-Model", ("/models/model",)) == (
        "The model 'gpt-4o' does not exist: this server serves 'My-Model' (GET /v1/models)")

"""``rewardkit serve --engine ray --print-config``: a Serve config file for ``serve deploy`` / KubeRay (no cluster
needed: Ray's own schema checks the file and the application is built from it, as ``serve deploy`` does)."""

from __future__ import annotations

import pytest
import yaml

pytest.importorskip("ray.serve")

from rewardkit.cli import main  # noqa: E402


def test_print_config_is_a_valid_serve_config_without_the_token(capsys, monkeypatch, tmp_path):
    from ray.serve.schema import ServeDeploySchema

    from rewardkit.integrations.ray_serve import app_builder

    monkeypatch.setenv("REWARDKIT_SERVE_TOKEN", "t0ken-never-in-files")
    assert main(["serve", "--engine", "ray", "--reward", "pickscore", "--model", str(tmp_path), "--host", "0.0.0.0",
                 "--max-replicas", "4", "--num-gpus", "1", "--max-batch", "16", "--print-config"]) == 0
    text = capsys.readouterr().out
    assert "t0ken-never-in-files" not in text
    conf = yaml.safe_load(text)
    ServeDeploySchema.model_validate(conf)  # Ray's own schema of `serve deploy` files
    (app,) = conf["applications"]
    assert app["import_path"] == "rewardkit.integrations.ray_serve:app_builder" and app["route_prefix"] == "/"
    args = app["args"]
    assert args["token_from_env"] is True and "token" not in args["server"] and args["server"]["max_batch"] == 16
    assert conf["http_options"] == {"host": "0.0.0.0", "port": 8000}
    built = app_builder(args)  # what `serve deploy` calls: the application, with the options asked for
    dep = built._bound_deployment
    assert dep._deployment_config.autoscaling_config.max_replicas == 4 and dep.ray_actor_options["num_gpus"] == 1.0
    # a token in the limits is refused, never written
    from rewardkit.integrations.ray_serve import serve_config

    with pytest.raises(ValueError, match="never holds the token"):
        serve_config("pickscore", server={"token": "x"})

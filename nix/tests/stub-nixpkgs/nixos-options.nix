# The NixOS options that services.ninfer defines into, declared with loose types: enough to catch a definition
# of an option that does not exist and to read back what the module produced.
{ lib, ... }:
let
  inherit (lib) mkOption types;
in
{
  options = {
    assertions = mkOption {
      type = types.listOf types.json;
      default = [ ];
    };
    warnings = mkOption {
      type = types.listOf types.str;
      default = [ ];
    };
    systemd.services = mkOption {
      type = types.attrsOf types.json;
      default = { };
    };
    services.nginx.enable = mkOption {
      type = types.bool;
      default = false;
    };
    services.nginx.appendHttpConfig = mkOption {
      type = types.str; # NixOS: types.lines
      default = "";
    };
    networking.firewall.allowedTCPPorts = mkOption {
      type = types.listOf types.port;
      default = [ ];
    };
    users.users = mkOption {
      type = types.attrsOf types.json;
      default = { };
    };
    users.groups = mkOption {
      type = types.attrsOf types.json;
      default = { };
    };
  };
}

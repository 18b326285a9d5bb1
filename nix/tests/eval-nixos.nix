# Evaluate NixOS modules with the offline stand-ins and report what services.ninfer produced:
#   nix-instantiate --eval --strict --json -E 'import nix/tests/eval-nixos.nix { modules = [ ... ]; }'
{
  modules,
  pkgs ? import ./stub-pkgs.nix,
}:
let
  lib = import ./lib-stub.nix;
  unit = import ../unit.nix;
  inherit (lib.evalModules {
    modules = [ ./nixos-stub.nix ] ++ modules;
    specialArgs = { inherit pkgs; };
  }) config;
  service = config.systemd.services.ninfer or null;
in
{
  failedAssertions = map (a: a.message) (builtins.filter (a: !a.assertion) config.assertions);
  inherit service;
  inherit (config.networking.firewall) allowedTCPPorts;
  inherit (config) users;
  # The unit file NixOS would write, rendered the way NixOS renders unit options.
  unitText =
    if service == null then
      null
    else
      unit.renderUnitFile {
        unitConfig = {
          Description = service.description;
          After = service.after;
        };
        installConfig.WantedBy = service.wantedBy;
        inherit (service) environment serviceConfig;
      };
}

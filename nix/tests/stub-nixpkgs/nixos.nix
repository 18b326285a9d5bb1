# `lib.nixosSystem` for the stub: the modules are evaluated by ./lib.nix against the few NixOS options declared in
# ./nixos-options.nix, and `systemd.units.<name>.unit` is rendered the way NixOS renders units (booleans as
# true/false, lists as repeated keys, environment as quoted Environment= lines). Besides `config`, it returns
# what tests read directly: `failedAssertions` and `unitTexts`.
{
  system ? builtins.currentSystem,
  modules,
  pkgs ? import ./. { inherit system; },
  ...
}:
let
  lib = import ./lib.nix;
  inherit (builtins) attrNames concatMap concatStringsSep isBool isList mapAttrs replaceStrings;

  inherit (lib.evalModules {
    modules = [ ./nixos-options.nix ] ++ modules;
    specialArgs = { inherit pkgs; };
  }) config;

  valueText = v: if isBool v then (if v then "true" else "false") else toString v;
  section =
    title: attrs:
    concatStringsSep "\n" (
      [ "[${title}]" ]
      ++ concatMap (key: map (v: "${key}=${valueText v}") (if isList attrs.${key} then attrs.${key} else [ attrs.${key} ])) (
        attrNames attrs
      )
    );
  quoteEnvironment = name: value: "\"" + replaceStrings [ "\\" "\"" "%" ] [ "\\\\" "\\\"" "%%" ] "${name}=${value}" + "\"";
  serviceText =
    service:
    concatStringsSep "\n\n" [
      (section "Unit" {
        Description = service.description or "";
        After = service.after or [ ];
      })
      (section "Service" (
        service.serviceConfig
        // {
          Environment = map (name: quoteEnvironment name service.environment.${name}) (attrNames (service.environment or { }));
        }
      ))
      (section "Install" { WantedBy = service.wantedBy or [ ]; })
    ]
    + "\n";
  unitTexts = mapAttrs (_: serviceText) config.systemd.services;
  unitDirectory =
    name: text:
    pkgs.runCommand "unit-${name}" { inherit text; } ''
      mkdir -p $out
      printf '%s' "$text" > $out/${name}
    '';
in
{
  config = config // {
    systemd = config.systemd // {
      units = builtins.listToAttrs (
        map (name: {
          name = "${name}.service";
          value.unit = unitDirectory "${name}.service" unitTexts.${name};
        }) (attrNames unitTexts)
      );
    };
  };
  inherit unitTexts;
  failedAssertions = map (a: a.message) (builtins.filter (a: !a.assertion) config.assertions);
}

# The few parts of nixpkgs that nix/module.nix touches, for evaluating it offline with ./lib-stub.nix.
let
  lib = import ./lib-stub.nix;
in
{
  ninfer = import ./stub-package.nix;
  stdenv.hostPlatform.system = builtins.currentSystem;
  # pkgs.formats.json: same option type and file contents as nixpkgs (which pretty-prints with jq).
  formats.json = { }: {
    type = lib.types.json;
    generate = name: value: builtins.toFile name (builtins.toJSON value);
  };
}

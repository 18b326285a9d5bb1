# A stand-in for `import nixpkgs { system, config, overlays }`, so that `nix flake check` can evaluate every flake
# output and build the checks offline (`--override-input nixpkgs path:.?dir=nix/tests/stub-nixpkgs`). Packages
# are placeholders; the two helpers the checks run (runCommand, systemd) are real enough to run
# `systemd-analyze` from the host. Only valid with unsandboxed builds (tests/packaging/nixeval.py configures them).
{
  system ? builtins.currentSystem,
  config ? { },
  overlays ? [ ],
}:
let
  lib = import ./lib.nix;
  stubPackage = import ./package.nix { inherit system; };
  shell = "/bin/sh";
  mkDerivation =
    name: script: extra:
    derivation (
      {
        inherit name system;
        builder = shell;
        args = [
          "-c"
          script
        ];
      }
      // extra
    );
  # Every package a derivation file asks for is the stub; its `override` keeps it callable like nixpkgs'.
  placeholder = stubPackage // {
    override = _: placeholder;
  };

  base = final: {
    inherit lib system config;
    stdenv.hostPlatform.system = system;
    callPackage = _file: _args: placeholder;
    python3Packages = { };
    cudaPackages_13_0 = { };

    formats.json = { }: {
      type = lib.types.json;
      generate = name: value: final.writeText name (builtins.toJSON value);
    };
    writeText =
      name: text:
      mkDerivation name "printf '%s' \"$text\" > $out" { inherit text; };
    runCommand =
      name: env: script:
      let
        tools = env.nativeBuildInputs or [ ];
      in
      mkDerivation name (
        "PATH=${lib.concatStringsSep ":" (map (p: "${p}/bin") tools)}:/usr/bin:/bin; set -e\n" + script
      ) (removeAttrs env [ "nativeBuildInputs" ]);
    # The host's systemd-analyze, behind a store path as nixpkgs' systemd would be.
    systemd = mkDerivation "systemd-host-wrapper" ''
      PATH=/usr/bin:/bin
      mkdir -p $out/bin
      printf '#!/bin/sh\nexec /usr/bin/systemd-analyze "$@"\n' > $out/bin/systemd-analyze
      chmod 555 $out/bin/systemd-analyze
    '' { };
    mkShell = _: placeholder;
  };

  fix = f: let result = f result; in result;
in
fix (final: builtins.foldl' (prev: overlay: prev // overlay final prev) (base final) overlays)

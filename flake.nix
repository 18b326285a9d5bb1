{
  description = "ninfer: single-GPU inference server for the Qwen3.5 model family (C++20/CUDA 13 engine, Python server)";

  # nixos-unstable of 2026-10-01 (rev and hash in flake.lock); it carries CUDA 13 and every Python dependency.
  inputs.nixpkgs.url = "github:NixOS/nixpkgs/nixos-unstable";

  outputs =
    { self, nixpkgs }:
    let
      # Top-level plumbing uses builtins only, so outputs that do not need packages (nixosModules, lib)
      # evaluate without fetching nixpkgs.
      systems = [
        "x86_64-linux"
        "aarch64-linux"
      ];
      forAllSystems =
        f:
        builtins.listToAttrs (
          map (system: {
            name = system;
            value = f system;
          }) systems
        );

      unit = import ./nix/unit.nix;

      pkgsFor =
        system:
        import nixpkgs {
          inherit system;
          config = {
            # Hopper (H100/H200, validated), Blackwell datacenter and consumer; the `a` variants are named
            # explicitly because nixpkgs never selects them by default.
            cudaCapabilities = [
              "9.0a"
              "12.0a"
              "10.0a"
            ];
            allowUnfreePredicate = import ./nix/cuda-unfree.nix;
          };
          overlays = [ self.overlays.default ];
        };

      # A unit rendered the plain-Linux way, for the checks.
      checkedUnit =
        pkgs: package:
        pkgs.writeText "ninfer.service"
          (unit.mkUnit {
            executable = "${package}/bin/ninfer-serve";
            apiKeyFile = "/etc/ninfer/api-keys";
            gpu = 0;
          }).text;
      verifyUnit =
        pkgs: name: unitFile:
        pkgs.runCommand "ninfer-${name}" { nativeBuildInputs = [ pkgs.systemd ]; } ''
          cp ${unitFile} ninfer.service
          systemd-analyze verify ./ninfer.service 2> verify.log
          if [ -s verify.log ]; then cat verify.log; exit 1; fi
          systemd-analyze security --offline=yes --threshold=25 ./ninfer.service > $out
        '';
    in
    {
      overlays.default = final: prev: {
        # CUDA 13 chosen explicitly: nixpkgs' default cudaPackages is still 12.x.
        ninfer = final.callPackage ./nix/package.nix { cudaPackages = final.cudaPackages_13_0; };
      };

      packages = forAllSystems (
        system:
        let
          pkgs = pkgsFor system;
        in
        {
          default = pkgs.ninfer;
          ninfer = pkgs.ninfer;
          # No CUDA (and nothing unfree): for machines without an NVIDIA GPU.
          ninfer-cpu = pkgs.ninfer.override { cudaSupport = false; };
          # The pinned llama-ui bundle (python/ninfer/serve/webui/pin.json), for `ninfer-serve --webui-dir`.
          webui = pkgs.callPackage ./nix/webui.nix { };
        }
      );

      apps = forAllSystems (system: {
        default = {
          type = "app";
          program = "${self.packages.${system}.default}/bin/ninfer-serve";
        };
      });

      devShells = forAllSystems (
        system:
        let
          pkgs = pkgsFor system;
        in
        {
          default = pkgs.callPackage ./nix/dev-shell.nix { cudaPackages = pkgs.cudaPackages_13_0; };
        }
      );

      # services.ninfer; the package defaults to this flake's build (its own pinned nixpkgs and CUDA), and with
      # webui.enable the web UI to this flake's pinned llama-ui (only then: building it needs nixpkgs).
      nixosModules.default =
        {
          config,
          lib,
          pkgs,
          ...
        }:
        let
          flakePackages = self.packages.${pkgs.stdenv.hostPlatform.system};
        in
        {
          imports = [ ./nix/module.nix ];
          services.ninfer = {
            package = lib.mkDefault flakePackages.default;
            webui.directory = lib.mkIf config.services.ninfer.webui.enable (lib.mkDefault flakePackages.webui);
          };
        };

      # The unit and the multi-GPU nginx config for non-NixOS systems: `nix eval --raw .#lib.mkUnit --apply ...`
      # (builtins only).
      lib = {
        inherit (unit) mkUnit renderUnitFile hardening;
        inherit (import ./nix/nginx.nix) mkNginxConfig;
      };

      checks = forAllSystems (
        system:
        let
          pkgs = pkgsFor system;
          cpuPackage = self.packages.${system}.ninfer-cpu;
          nixos = nixpkgs.lib.nixosSystem {
            inherit system;
            modules = [
              self.nixosModules.default
              {
                services.ninfer = {
                  enable = true;
                  package = cpuPackage;
                  models.small.path = "/var/lib/models/small.ninfer";
                  apiKeyFile = "/etc/ninfer/api-keys";
                  webui.enable = true; # the web UI defaults to this flake's `webui` package
                };
              }
            ];
          };
          # This module's assertions only: the system is a fragment (no root file system, no boot loader), which
          # real NixOS's own assertions refuse, and only the ninfer service is under test here.
          ninferPrefix = "services.ninfer:";
          failed = builtins.filter (
            a: !a.assertion && builtins.substring 0 (builtins.stringLength ninferPrefix) a.message == ninferPrefix
          ) nixos.config.assertions;
        in
        {
          package-cpu = cpuPackage;
          unit = verifyUnit pkgs "unit" (checkedUnit pkgs cpuPackage);
          nixos-module =
            assert failed == [ ] || throw (builtins.concatStringsSep "\n" (map (a: a.message) failed));
            verifyUnit pkgs "nixos-module" "${nixos.config.systemd.units."ninfer.service".unit}/ninfer.service";
        }
      );
    };
}

# Offline stand-in for the nixpkgs flake input; see ./default.nix.
{
  outputs = _: {
    lib = import ./lib.nix // {
      nixosSystem = import ./nixos.nix;
    };
  };
}

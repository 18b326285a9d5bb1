# A small stand-in for nixpkgs `lib`, enough to evaluate nix/module.nix without nixpkgs (which Nix 2.8 cannot
# evaluate and which is not reachable offline). It follows the real module system where the module relies on it:
# option declarations with defaults, mkIf / mkMerge / mkOverride (mkDefault, mkForce) pushed down to the options,
# priorities, type checks and merges, submodules, and an error for every definition of an undeclared option.
# It is test scaffolding: the real evaluation is `nix flake check` with the real nixpkgs (see docs/deployment.md).
let
  inherit (builtins)
    all
    any
    attrNames
    concatLists
    concatMap
    concatStringsSep
    elem
    filter
    foldl'
    genList
    hasAttr
    head
    isAttrs
    isBool
    isFunction
    isInt
    isList
    isPath
    isString
    length
    listToAttrs
    map
    mapAttrs
    match
    substring
    tail
    toJSON
    typeOf
    ;

  showLoc = loc: concatStringsSep "." loc;
  showValue = v: if isAttrs v && v.type or null == "derivation" then "<derivation ${v.name}>" else toJSON v;

  unique = foldl' (acc: x: if elem x acc then acc else acc ++ [ x ]) [ ];
  optional = cond: value: if cond then [ value ] else [ ];
  imap0 = f: list: builtins.genList (n: f n (builtins.elemAt list n)) (builtins.length list);
  optionals = cond: list: if cond then list else [ ];
  optionalAttrs = cond: attrs: if cond then attrs else { };
  isDerivation = v: isAttrs v && v.type or null == "derivation";
  hasPrefix = prefix: s: substring 0 (builtins.stringLength prefix) s == prefix;
  mapAttrsToList = f: attrs: map (name: f name attrs.${name}) (attrNames attrs);
  filterAttrs =
    pred: attrs:
    listToAttrs (
      concatMap (name: optional (pred name attrs.${name}) { inherit name; value = attrs.${name}; }) (attrNames attrs)
    );
  recursiveUpdate =
    lhs: rhs:
    lhs
    // mapAttrs (
      name: value: if isAttrs value && isAttrs (lhs.${name} or null) then recursiveUpdate lhs.${name} value else value
    ) rhs;

  # ---- properties: mkIf, mkMerge, mkOverride -------------------------------------------------------------------
  mkIf = condition: content: {
    _type = "if";
    inherit condition content;
  };
  mkMerge = contents: {
    _type = "merge";
    inherit contents;
  };
  mkOverride = priority: content: {
    _type = "override";
    inherit priority content;
  };
  defaultPriority = 100;
  optionDefaultPriority = 1500;

  propertyOf = v: if isAttrs v then v._type or null else null;

  # A definition is { value, conds, prio }. Discharging strips the properties on top of its value: mkMerge splits
  # it, mkIf adds a condition (not forced yet: conditions usually read `config`), mkOverride sets the priority.
  # A shallow discharge leaves an override's content untouched (marked `pending`), so that a definition which
  # loses on priority is never evaluated, as in the real module system (a losing mkDefault may name a package
  # that cannot be built here).
  dischargeWith =
    shallow: def:
    let
      v = def.value;
      kind = propertyOf v;
    in
    if def.pending or false then
      (if shallow then [ def ] else dischargeWith false (removeAttrs def [ "pending" ]))
    else if kind == "if" then
      dischargeWith shallow (def // { conds = def.conds ++ [ v.condition ]; value = v.content; })
    else if kind == "merge" then
      concatMap (content: dischargeWith shallow (def // { value = content; })) v.contents
    else if kind == "override" then
      dischargeWith shallow (def // { prio = v.priority; value = v.content; pending = true; })
    else
      [ def ];
  discharge = dischargeWith false;

  # The definitions of attribute `name` inside a list of definitions of an attribute set.
  childDefs =
    loc: name: defs:
    concatMap (
      def:
      if !isAttrs def.value then
        throw "${showLoc loc} is not an option; it must be set to an attribute set, not ${typeOf def.value}"
      else
        optional (hasAttr name def.value) (def // { value = def.value.${name}; })
    ) (concatMap discharge defs);

  # The winning definitions: those whose conditions hold, at the best (lowest) priority.
  activeDefs =
    defs:
    let
      holds = def: all (c: c) def.conds;
      live = filter holds (concatMap (dischargeWith true) defs);
      best = foldl' (p: def: if def.prio < p then def.prio else p) 100000 live;
    in
    filter holds (concatMap discharge (filter (def: def.prio == best) live));

  mergeWith =
    loc: type: defs:
    let
      active = activeDefs defs;
      bad = filter (def: !type.check def.value) active;
    in
    if active == [ ] then
      throw "The option `${showLoc loc}' is used but not defined."
    else if bad != [ ] then
      throw "A definition for option `${showLoc loc}' is not of type `${type.description}': ${showValue (head bad).value}"
    else
      type.merge loc active;

  # ---- types ------------------------------------------------------------------------------------------------------
  mkOptionType =
    {
      name,
      description ? name,
      check ? (_: true),
      merge ? mergeEqualOption,
    }:
    {
      _type = "option-type";
      inherit name description check merge;
    };

  mergeEqualOption =
    loc: defs:
    let
      values = unique (map (def: def.value) defs);
    in
    if length values == 1 then
      head values
    else
      throw "The option `${showLoc loc}' has conflicting definition values: ${concatStringsSep ", " (map showValue values)}";

  mergeAttrsOf =
    elemType: loc: defs:
    let
      names = unique (concatMap (def: attrNames def.value) defs);
    in
    listToAttrs (
      map (name: {
        inherit name;
        value = mergeWith (loc ++ [ name ]) elemType (childDefs loc name defs);
      }) names
    );

  ints = {
    unsigned = mkOptionType {
      name = "unsignedInt";
      check = v: isInt v && v >= 0;
    };
    positive = mkOptionType {
      name = "positiveInt";
      check = v: isInt v && v > 0;
    };
    between =
      lo: hi:
      mkOptionType {
        name = "intBetween";
        description = "integer between ${toString lo} and ${toString hi} (both inclusive)";
        check = v: isInt v && v >= lo && v <= hi;
      };
  };

  types = rec {
    bool = mkOptionType {
      name = "bool";
      description = "boolean";
      check = isBool;
    };
    int = mkOptionType {
      name = "int";
      description = "signed integer";
      check = isInt;
    };
    inherit ints;
    port = ints.between 0 65535;
    str = mkOptionType {
      name = "str";
      description = "string";
      check = isString;
    };
    nonEmptyStr = mkOptionType {
      name = "nonEmptyStr";
      description = "non-empty string";
      check = v: isString v && match "[[:space:]]*" v == null;
    };
    strMatching =
      pattern:
      mkOptionType {
        name = "strMatching ${pattern}";
        description = "string matching the pattern ${pattern}";
        check = v: isString v && match pattern v != null;
      };
    path = mkOptionType {
      name = "path";
      description = "absolute path";
      check = v: isPath v || (isString v && substring 0 1 v == "/") || isDerivation v;
    };
    package = mkOptionType {
      name = "package";
      check = isDerivation;
    };
    enum =
      values:
      mkOptionType {
        name = "enum";
        description = "one of ${concatStringsSep ", " (map toJSON values)}";
        check = v: elem v values;
      };
    listOf =
      elemType:
      mkOptionType {
        name = "listOf";
        description = "list of ${elemType.description}";
        check = isList;
        merge =
          loc: defs:
          concatLists (
            map (
              def:
              genList (
                i: mergeWith (loc ++ [ "[${toString i}]" ]) elemType [ (def // { value = builtins.elemAt def.value i; }) ]
              ) (length def.value)
            ) defs
          );
      };
    attrsOf =
      elemType:
      mkOptionType {
        name = "attrsOf";
        description = "attribute set of ${elemType.description}";
        check = isAttrs;
        merge = mergeAttrsOf elemType;
      };
    nullOr =
      elemType:
      mkOptionType {
        name = "nullOr";
        description = "null or ${elemType.description}";
        check = v: v == null || elemType.check v;
        merge =
          loc: defs:
          let
            nulls = filter (def: def.value == null) defs;
          in
          if length nulls == length defs then
            null
          else if nulls != [ ] then
            throw "The option `${showLoc loc}' is defined both null and not null."
          else
            elemType.merge loc defs;
      };
    either =
      a: b:
      mkOptionType {
        name = "either";
        description = "${a.description} or ${b.description}";
        check = v: a.check v || b.check v;
        merge = loc: defs: if all (def: a.check def.value) defs then a.merge loc defs else b.merge loc defs;
      };
    oneOf = ts: foldl' either (head ts) (tail ts);
    # JSON values: attribute sets merge key by key (so priorities work at any depth), anything else must agree.
    json = mkOptionType {
      name = "json";
      description = "JSON value";
      check =
        v: v == null || isBool v || isInt v || builtins.isFloat v || isString v || isPath v || isList v || isAttrs v;
      merge = loc: defs: if all (def: isAttrs def.value) defs then mergeAttrsOf json loc defs else mergeEqualOption loc defs;
    };
    anything = json;
    submodule = module: mkOptionType {
      name = "submodule";
      check = isAttrs;
      merge = loc: defs: (evalModules { modules = [ module ] ++ map (def: { config = def.value; }) defs; prefix = loc; }).config;
    };
  };

  # ---- option declarations --------------------------------------------------------------------------------------
  mkOption = attrs: { _type = "option"; } // attrs;
  isOption = v: isAttrs v && v._type or null == "option";
  mkEnableOption = name: mkOption {
    type = types.bool;
    default = false;
    example = true;
    description = "Whether to enable ${name}.";
  };
  mkPackageOption =
    pkgs: name:
    { default ? [ name ], extraDescription ? "", ... }:
    let
      attrPath = if isList default then default else [ default ];
    in
    mkOption {
      type = types.package;
      default = foldl' (set: attr: set.${attr}) pkgs attrPath;
      defaultText = literalExpression "pkgs.${concatStringsSep "." attrPath}";
      description = "The ${name} package to use. ${extraDescription}";
    };
  literalExpression = text: { _type = "literalExpression"; inherit text; };

  # ---- evaluation -----------------------------------------------------------------------------------------------
  # Modules are paths, functions of { config, lib, pkgs, ... } or attribute sets with imports / options / config
  # (an attribute set without those keys is all config, as in NixOS).
  collectModules =
    args: modules:
    concatMap (
      m:
      let
        loaded = if isPath m || isString m then import m else m;
        called = if isFunction loaded then loaded args else loaded;
        # As in NixOS: a module without `options` or `config` is all config, besides its imports.
        structured = called ? options || called ? config;
        this = {
          options = called.options or { };
          config = if structured then called.config or { } else removeAttrs called [ "meta" "_file" "imports" ];
        };
      in
      [ this ] ++ collectModules args (called.imports or [ ])
    ) modules;

  # Merge option trees, refusing to declare one option twice.
  mergeDeclarations =
    loc: a: b:
    a
    // mapAttrs (
      name: decl:
      if !(hasAttr name a) then
        decl
      else if isOption decl || isOption a.${name} then
        throw "The option `${showLoc (loc ++ [ name ])}' is declared twice."
      else
        mergeDeclarations (loc ++ [ name ]) a.${name} decl
    ) b;

  # Every definition must land on a declared option; properties are looked through (mkIf false included, as in
  # the real module system, so a typo is caught even where it is switched off).
  checkDefined =
    loc: decls: defs:
    all (
      def:
      let
        value = def.value;
      in
      if !isAttrs value then
        throw "${showLoc loc} is not an option; it must be set to an attribute set"
      else
        all (
          name:
          if !(hasAttr name decls) then
            throw "The option `${showLoc (loc ++ [ name ])}' does not exist."
          else
            isOption decls.${name} || checkDefined (loc ++ [ name ]) decls.${name} [ { value = value.${name}; } ]
        ) (attrNames value)
    ) (concatMap discharge' defs);
  # Discharge ignoring conditions (structure only).
  discharge' = def: discharge { value = def.value; conds = [ ]; prio = defaultPriority; };

  evalTree =
    loc: decls: defs:
    mapAttrs (
      name: decl:
      let
        here = loc ++ [ name ];
        defsHere = childDefs loc name defs;
      in
      if isOption decl then
        mergeWith here decl.type (
          defsHere ++ optional (decl ? default) { value = decl.default; conds = [ ]; prio = optionDefaultPriority; pending = true; }
        )
      else
        evalTree here decl defsHere
    ) decls;

  evalModules =
    {
      modules,
      specialArgs ? { },
      prefix ? [ ],
    }:
    let
      args = specialArgs // {
        inherit config lib options;
      };
      collected = collectModules args modules;
      options = foldl' (mergeDeclarations prefix) { } (map (m: m.options) collected);
      defs = map (m: { value = m.config; conds = [ ]; prio = defaultPriority; }) collected;
      config = assert checkDefined prefix options defs; evalTree prefix options defs;
    in
    {
      inherit config options;
    };

  lib = {
    inherit
      mkIf
      mkMerge
      mkOverride
      mkOption
      mkEnableOption
      mkPackageOption
      literalExpression
      mkOptionType
      types
      evalModules
      optional
      optionals
      imap0
      optionalAttrs
      isDerivation
      hasPrefix
      mapAttrsToList
      filterAttrs
      recursiveUpdate
      unique
      any
      all
      elem
      concatStringsSep
      attrNames
      mapAttrs
      ;
    mkDefault = mkOverride 1000;
    mkForce = mkOverride 50;
  };
in
lib

#include "fusion/fusion_pass.h"

#include "fusion/planner.h"
#include "rewrite/pass.h"

namespace nnfuse {

void register_fusion_passes() {
  PassInfo info{"fusion-plan",
                "DNNFusion planning: seed Many-to-Many anchors, grow blocks by the mapping-type table "
                "(args: profile=true|false, cache=PATH, max_inputs=N, max_members=N)",
                {"shapes"},
                {},
                /*analysis=*/true};
  info.check_args = [](const PassArgs& args) {
    for (auto& [key, value] : args.values)
      if (key != "profile" && key != "cache" && key != "max_inputs" && key != "max_members")
        fail(ErrorKind::Invalid, "pass 'fusion-plan': unknown argument '" + key + "' (arguments: profile=BOOL, cache=PATH, max_inputs=N, max_members=N)");
    args.get_bool("profile", true), args.get_int("max_inputs", -1), args.get_int("max_members", -1);
  };
  register_pass(info,
                [](PassContext& ctx, const PassArgs& args) {
                  PlanOptions o;
                  o.profile = args.get_bool("profile", true);
                  o.profile_cache_path = args.get("cache", "");
                  o.max_block_inputs = int(args.get_int("max_inputs", -1));
                  o.max_block_members = int(args.get_int("max_members", -1));
                  // The driver's --no-profile / --profile-cache override the pipeline's defaults.
                  if (auto it = ctx.artifacts.find("no_profile"); it != ctx.artifacts.end() && std::any_cast<bool>(it->second))
                    o.profile = false;
                  if (auto it = ctx.artifacts.find("profile_cache"); it != ctx.artifacts.end())
                    o.profile_cache_path = std::any_cast<std::string>(it->second);
                  ctx.artifacts["fusion_plan"] = plan_fusion(ctx.graph(), target_by_name(ctx.target), o);
                });
}

}  // namespace nnfuse

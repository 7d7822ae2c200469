// Whether an executor is there to run the turns, read from the fleet (GET /api/executors, the rows the
// executors renew): with none live, Chat says since when none was seen and that messages wait meanwhile.
import { api } from "./api.js";
import { renderConversation } from "./chat.js";
import { $ } from "./dom.js";
import { S } from "./state.js";

export const FLEET_POLL_MS = 10_000;

export async function loadFleet() {
  const { executors } = await api("/api/executors");
  const was = Boolean(S.fleetDown);
  const ages = executors.map((x) => x.lease_age_s).filter((a) => typeof a === "number");
  S.fleetDown = executors.some((x) => x.state === "live") ? null
    : { seenAgoS: ages.length ? Math.min(...ages) : null, at: Date.now() };
  renderFleet();
  if (was !== Boolean(S.fleetDown)) renderConversation();  // pending messages say what they wait for
}

export function ago(s) {
  if (s < 90) return `${Math.round(s)} s`;
  if (s < 90 * 60) return `${Math.round(s / 60)} min`;
  if (s < 36 * 3600) return `${Math.round(s / 3600)} h`;
  return `${Math.round(s / 86400)} days`;
}

export function renderFleet() {
  const el = $("#executor-banner");
  const down = S.fleetDown;
  el.hidden = !down;
  if (!down) return;
  el.textContent = down.seenAgoS === null
    ? "No executor has started — messages wait until one runs (petal-dispatch up, or petal-dispatch executor)."
    : `The executor has not been seen for ${ago(down.seenAgoS + (Date.now() - down.at) / 1000)} — messages wait until it is back.`;
}

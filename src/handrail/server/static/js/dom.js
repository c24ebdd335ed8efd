// Small DOM helpers the page's modules share: find by id, build elements, put values in words.

/** The element with this id. */
export const $ = (id) => document.getElementById(id);

/**
 * An element: `props` are attributes (`class`, `text`, `on<event>` listeners, properties for
 * non-string values), `children` nodes or strings (always text: never parsed as markup).
 */
export function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(props)) {
    if (value === undefined || value === null || value === false) continue;
    if (name === "class") node.className = value;
    else if (name === "text") node.textContent = value;
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else if (name in node && typeof value !== "string") node[name] = value;
    else node.setAttribute(name, value === true ? "" : value);
  }
  for (const child of children.flat()) if (child !== null && child !== undefined) node.append(child);
  return node;
}

/** A value in a few words: `key: value · key: value` for an object. */
export function describe(value) {
  if (value === null || value === undefined || value === "") return "";
  if (typeof value !== "object") return String(value);
  if (Array.isArray(value)) return value.map(describe).join(", ");
  return Object.entries(value)
    .map(([k, v]) => `${k}: ${typeof v === "object" && v !== null ? JSON.stringify(v) : v}`)
    .join(" · ");
}

/** A time (seconds since the epoch) as a short local date and time ("" for none). */
export function when(seconds) {
  if (!seconds) return "";
  return new Date(seconds * 1000).toLocaleString([], { dateStyle: "short", timeStyle: "short" });
}

/** Names joined as people read them: "bo", "bo and cy", "ana, bo and cy". */
export function joined(names) {
  if (names.length < 2) return names.join("");
  return `${names.slice(0, -1).join(", ")} and ${names[names.length - 1]}`;
}

/** A web link only when it is one: anything but http(s) is never a link (javascript:...). */
export function webLink(url) {
  try {
    const parsed = new URL(String(url));
    return parsed.protocol === "http:" || parsed.protocol === "https:" ? parsed.href : null;
  } catch {
    return null;
  }
}

export const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

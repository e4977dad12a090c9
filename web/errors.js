// Errors in plain words for the chat page: what happened and what the user can do about it.
// explain(error, model) -> [title, what to do]; `error` is an Error from webinfer.js / the worker (its name is the
// Python or loader error class: PreflightError, IntegrityError, DownloadError, DeviceLostError, ...).

export function explain(e, model = null) {
  const name = e?.name || "Error";
  const msg = String(e?.message || e);
  const what = model ? model.name : "the model";
  if (name === "PreflightError" && /no WebGPU/i.test(msg)) {
    return ["This browser cannot run models on its GPU: it has no WebGPU.",
      "Set Engine to Auto or CPU to run on the processor instead, or open this page in a recent Chrome or Edge " +
      "(version 113 or later), or turn WebGPU on in your browser's settings (Safari and Firefox have it behind a " +
      "setting in some versions)."];
  }
  if (name === "PreflightError" && /no GPU adapter/i.test(msg)) {
    return ["WebGPU is on, but the browser offers it no GPU.",
      "Set Engine to Auto or CPU to run on the processor instead, or turn on hardware acceleration in the " +
      "browser's settings, update the graphics driver, or try another browser."];
  }
  if (name === "PreflightError" || /maxStorage|maxBuffer|limit|too large|exceeds|out of memory|OutOfMemory/i.test(msg) &&
      /GPU|Validation|Operation|Preflight/.test(name)) {
    return [`This device's GPU is too small for ${what}.`,
      `Pick a smaller model, set Engine to CPU, close other tabs that use the GPU, or use a device with more GPU ` +
      `memory. (${msg})`];
  }
  if (name === "QuotaExceededError" || /quota|storage is full/i.test(msg)) {
    return ["This device's storage for this site is full.",
      "Remove models you no longer use (Remove from device), free disk space, or allow this site more storage."];
  }
  if (name === "IntegrityError") {
    return [`The downloaded files of ${what} are damaged or do not match this site (checksum mismatch).`,
      "Press Load to try again. If it keeps failing, the site's files are out of date: rebuild it with `webinfer site`."];
  }
  if (name === "DownloadError") {
    return [`${what} could not be downloaded.`,
      `Check the network connection and press Load again; files already downloaded are kept. (${msg})`];
  }
  if (name === "DeviceLostError") {
    return ["The GPU was reset (driver restart, sleep or lack of memory).",
      "Your conversation is kept. Send again, or press Regenerate: the model is rebuilt on the GPU first."];
  }
  if (name === "ContextOverflowError") {
    return ["This conversation is longer than the model can read at once.",
      "Start a new chat, or edit an earlier message to shorten the conversation."];
  }
  return [`Something went wrong (${name}).`, msg];
}

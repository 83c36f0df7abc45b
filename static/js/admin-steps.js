// Worked-steps editor in the card admin: "Add a step" appends an empty row without a save.
// Without JavaScript the editor still works: it always renders two empty rows.
(function () {
  "use strict";
  function addButton(fieldset) {
    var list = fieldset.querySelector("ol");
    var button = document.createElement("button");
    button.type = "button";
    button.className = "button";
    button.textContent = "Add a step";
    button.addEventListener("click", function () {
      var index = list.children.length;
      var id = fieldset.dataset.baseId + "_" + index;
      var item = document.createElement("li");
      var label = document.createElement("label");
      label.htmlFor = id;
      label.textContent = "Step " + (index + 1);
      var area = document.createElement("textarea");
      area.name = fieldset.dataset.name + "_" + index;
      area.id = id;
      area.rows = 2;
      area.cols = 80;
      item.appendChild(label);
      item.appendChild(area);
      list.appendChild(item);
      area.focus();
    });
    fieldset.appendChild(button);
  }
  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("fieldset.steps-editor").forEach(addButton);
  });
})();
